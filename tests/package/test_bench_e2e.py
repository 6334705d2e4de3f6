"""`opgen bench --e2e` (opgen/bench/e2e.py) on a tiny Llama: on the CPU it
decodes eagerly, opgen's layers through the numpy reference (the run's
logic, not its figures); on a GPU with graphs and the peers."""
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from opgen.bench import e2e, e2e_variants  # noqa: E402
from tiny_llama import TINY  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")


def plan(variants, batches=(1, 2), **kw):
    return e2e.Plan("tiny", TINY, "test", batches=batches, prompt=6, new_tokens=4, repeats=2,
                    variants=variants, **kw)


@pytest.fixture(scope="module")
def result():
    return e2e.run(plan(("fp16", "no_linear", "opgen:w4a16_sym_g128", "opgen:w8a8_int8", "torch_int4")),
                   log=lambda s: None)


def rows_of(result, variant):
    return [r for r in result["rows"] if r["variant"] == variant]


def test_every_variant_and_batch_has_a_row(result):
    assert [(r["variant"], r["batch"]) for r in result["rows"]] == [
        (v, b) for v in ("fp16", "no_linear", "opgen:w4a16_sym_g128", "opgen:w8a8_int8", "torch_int4")
        for b in (1, 2)]
    # (no CUDA: eager, neither compiled nor captured, whatever the plan says)
    assert result["plan"]["graph"] is False and result["plan"]["compile"] is False
    assert result["model"]["linear_layers"] == 14
    for r in rows_of(result, "fp16"):
        assert r["error"] is None and r["speedup"] == 1.0 and r["rel_err"] is None
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / r["ms_per_step"] * 1e3)
        assert len(r["times_ms"]) == 2 and r["prefill_ms"] > 0


def test_opgen_rows_have_speed_and_accuracy(result):
    for r in rows_of(result, "opgen:w4a16_sym_g128") + rows_of(result, "opgen:w8a8_int8"):
        assert r["error"] is None and r["ms_per_step"] > 0 and r["speedup"] > 0
        # the kernels' error alone (the reference takes the same weights and,
        # for W8A8, the same int8 activations): about the reference's own
        # fp16-vs-fp32 difference (with int8 activations a rounding step
        # that flips amplifies both to about 1e-2 on this tiny model)
        assert 0 < r["rel_err"] < 5e-2 and 0 < r["rel_err_fp32"] < 5e-2
        assert r["rel_err"] <= 4 * r["rel_err_fp32"]
        assert 0.0 <= r["agreement"] <= 1.0 and 0.0 <= r["agreement_fp32"] <= 1.0


def test_no_linear_times_the_step_without_its_linear_layers(result):
    for r in rows_of(result, "no_linear"):
        assert r["error"] is None and r["ms_per_step"] > 0 and r["speedup"] > 0
        assert r["rel_err"] is None and r["agreement"] is None


def test_a_peer_that_cannot_run_here_is_skipped_with_why(result):
    for r in rows_of(result, "torch_int4"):
        assert r["error"].startswith("skipped:") and r["ms_per_step"] is None


def test_a_failing_variant_fails_its_rows_and_the_command(tmp_path, monkeypatch, capsys):
    def broken(self, linear):
        raise RuntimeError("no kernel")
    monkeypatch.setattr(e2e_variants.Opgen, "layer", broken)
    rc = e2e.main(plan(("fp16", "opgen:bnb_nf4"), batches=(1,), accuracy=False), tmp_path, "cmd",
                  plots=False)
    out = json.loads((tmp_path / "e2e.json").read_text())
    assert rc == 1 and out["command"] == "cmd" and "targets" in out
    bad = [r for r in out["rows"] if r["variant"] == "opgen:bnb_nf4"]
    assert bad and all("quantize: RuntimeError: no kernel" in r["error"] for r in bad)
    assert "1 row(s) failed" in capsys.readouterr().err
    assert (tmp_path / "e2e.md").read_text().startswith("# opgen bench --e2e")


def test_skips_alone_do_not_fail_the_command(tmp_path):
    rc = e2e.main(plan(("fp16", "gemlite_w4"), batches=(1,)), tmp_path, "cmd", plots=False)
    assert rc == 0 and json.loads((tmp_path / "e2e.json").read_text())["complete"] is True


def test_load_time_and_its_target(tmp_path):
    """--load-time: the model's GPTQ checkpoint loaded by a fresh process,
    its figures in e2e.json and e2e.md, the load target evaluated."""
    assert e2e.main(plan(("fp16",), batches=(1,), load_time=True), tmp_path, "cmd", plots=False) == 0
    out = json.loads((tmp_path / "e2e.json").read_text())
    load = out["load"]
    assert load["format"] == "gptq_v2_w4a16_g128" and load["served"] == 14 and load["process_s"] > 0
    (t,) = [t for t in out["targets"] if t["target"].startswith("GPTQ checkpoint directory")]
    assert t["measured"] == load["process_s"] and t["status"] in ("met", "missed")
    assert "## Checkpoint load" in (tmp_path / "e2e.md").read_text()


def test_results_so_far_after_each_row(tmp_path):
    """A run cut short keeps what it measured: on_rows gets the result after
    every row (main writes it out), complete only at the end."""
    seen = []
    out = e2e.run(plan(("fp16", "torch_int4"), batches=(1, 2), accuracy=False), log=lambda s: None,
                  on_rows=lambda r: seen.append((r["complete"], [(x["variant"], x["batch"]) for x in r["rows"]])))
    done = [("fp16", 1), ("fp16", 2), ("torch_int4", 1), ("torch_int4", 2)]
    assert seen == [(False, done[:n]) for n in range(1, 5)] and out["complete"]


@pytest.mark.gpu
@cuda
def test_gpu_a_tiny_model_end_to_end(tmp_path):
    variants = ("fp16", "opgen:w4a16_sym_g128", "opgen:bnb_nf4", "opgen:w8a8_int8", "torch_int4",
                "gemlite_w4")
    rc = e2e.main(plan(variants, batches=(1, 16)), tmp_path, "cmd")
    out = json.loads((tmp_path / "e2e.json").read_text())
    assert out["plan"]["graph"] is True and out["plan"]["compile"] is True
    for r in out["rows"]:
        if r["variant"] == "gemlite_w4" and (r["error"] or "").startswith("skipped:"):
            continue
        assert r["error"] is None, r
        assert r["graph"] is True and r["ms_per_step"] > 0
        if r["variant"] != "fp16":
            assert r["rel_err"] <= 2 * r["rel_err_fp32"] + 1e-3, r
    assert rc == 0


def test_fused_variant_decodes_as_the_plain_one():
    """opgen:SPEC+fuse on the tiny Llama: q / k / v and gate / up run as one
    layer each (2 x 2 wide layers for its 14 linears) and decode the tokens
    the plain variant decodes, with its error."""
    out = e2e.run(plan(("opgen:w4a16_sym_g128", "opgen:w4a16_sym_g128+fuse"), batches=(1,)), log=lambda s: None)
    plain, fused = (rows_of(out, v)[0] for v in ("opgen:w4a16_sym_g128", "opgen:w4a16_sym_g128+fuse"))
    assert plain["error"] is None and fused["error"] is None
    assert fused["rel_err"] == pytest.approx(plain["rel_err"], rel=1e-3)
    assert fused["agreement"] == plain["agreement"]
