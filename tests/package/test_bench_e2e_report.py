"""The outputs of `opgen bench --e2e` (opgen/bench/e2e_report.py): the
targets evaluated on rows, the Markdown and the files. Pure Python."""
import json

from opgen.bench import e2e_report as rep

W4 = rep.W4A16


def row(variant, batch, ms, **kw):
    r = dict(variant=variant, batch=batch, ms_per_step=ms, tokens_per_s=ms and batch / ms * 1e3,
             speedup=None, prefill_ms=1.0, graph=True, rel_err=None, rel_err_fp32=None,
             agreement=None, error=None, times_ms=[ms])
    r.update(kw)
    return r


def rows():
    out = []
    for b, fp16 in ((1, 9.0), (16, 10.0), (64, 15.0)):
        out.append(row("fp16", b, fp16, speedup=1.0))
        out.append(row(W4, b, fp16 / 3.0, speedup=3.0, rel_err=1e-3, rel_err_fp32=1e-3))
        out.append(row(rep.shipped("bnb_nf4"), b, fp16 / 3.0 * 1.2, rel_err=3e-3, rel_err_fp32=1e-3))
        out.append(row("torch_int4", b, fp16 / 2.0))
        out.append(row("gemlite_w4", b, None, tokens_per_s=None, error="skipped: not installed"))
    return out


def by_label(targets):
    return {t["target"]: t for t in targets}


def test_targets_are_evaluated_from_the_rows():
    t = by_label(rep.evaluate(rows()))
    assert t["W4A16 batch 1 >= 2.8x fp16"]["status"] == "met"
    assert t["W4A16 batch 1 >= 2.8x fp16"]["measured"] == 3.0
    # W4A16 against the faster peer that ran (torch int4 at 2x fp16): 1.5x
    vs = t["W4A16 batch 16 >= 1.3x the faster of torch int4 / gemlite"]
    assert vs["status"] == "met" and abs(vs["measured"] - 1.5) < 1e-9
    nf4 = t["bnb_nf4 batch 1 step <= 1.15x W4A16's"]
    assert nf4["status"] == "missed" and abs(nf4["measured"] - 1.2) < 1e-9
    assert t["bnb_nf4 logits <= 2x the fp16-vs-fp32 difference"]["status"] == "missed"
    assert t["w4a16_sym_g128 logits <= 2x the fp16-vs-fp32 difference"]["status"] == "met"
    assert t["W8A8 batch 64 >= 1.6x fp16"]["status"] == "not measured"
    assert t["mxfp4 batch 64 step <= 1.15x W4A16's"]["status"] == "not measured"


def test_a_peer_not_yet_measured_leaves_the_peer_target_not_measured():
    """A run cut short before gemlite's batch 64: W4A16 is not compared with
    torch int4 alone there."""
    cut = [r for r in rows() if not (r["variant"] == "gemlite_w4" and r["batch"] == 64)]
    t = by_label(rep.evaluate(cut))
    assert t["W4A16 batch 64 >= 1.3x the faster of torch int4 / gemlite"]["status"] == "not measured"
    assert t["W4A16 batch 16 >= 1.3x the faster of torch int4 / gemlite"]["status"] == "met"


def test_error_rows_are_never_measured():
    bad = [dict(r, error="boom") if r["variant"] == W4 else r for r in rows()]
    t = by_label(rep.evaluate(bad))
    assert t["W4A16 batch 1 >= 2.8x fp16"]["status"] == "not measured"


def results():
    return {"command": "opgen bench --e2e --out x", "env": {"device": "GPU", "torch": "2"},
            "plan": {"model": "llama-3-8b", "prompt": 128, "new_tokens": 64, "repeats": 3,
                     "graph": True, "batches": [1, 16, 64]},
            "model": {"layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                      "vocab_size": 128256},
            "rows": rows(), "targets": rep.evaluate(rows())}


def test_markdown_has_both_tables():
    md = rep.markdown(results())
    assert md.startswith("# opgen bench --e2e: GPU")
    assert f"| {W4} | 16 |" in md and "skipped: not installed" in md
    assert "## Targets" in md and "CUDA graph" in md


def test_write_outputs(tmp_path):
    paths = rep.write_outputs(results(), tmp_path, plots=False)
    assert [p.split("/")[-1] for p in paths] == ["e2e.json", "e2e.md"]
    assert json.loads((tmp_path / "e2e.json").read_text())["plan"]["model"] == "llama-3-8b"
    assert rep.plot(dict(results(), rows=[]), tmp_path) == []


def test_the_load_target_and_paragraph():
    t = rep.evaluate(rows(), {"process_s": 12.5})[-1]
    assert (t["measured"], t["status"]) == (12.5, "met")
    assert rep.evaluate(rows(), {"process_s": 31.0})[-1]["status"] == "missed"
    assert rep.evaluate(rows())[-1]["status"] == "not measured"
    load = {"format": "gptq_v2_w4a16_g128", "bytes": 5.7e9, "write_s": 9.0, "process_s": 12.5,
            "import_s": 3.0, "load_s": 8.0, "served": 224, "dequantized": 0}
    md = rep.markdown(dict(results(), load=load))
    assert "5.70 GB" in md and "ready 12.5 s" in md and "224 layers on opgen" in md
    assert "Failed: boom" in rep.markdown(dict(results(), load={"error": "boom"}))


def test_speed_table_by_variant_and_batch():
    t = rep.speed_table(rows()).splitlines()
    assert t[0] == ("| variant | batch 1: tokens/s (x fp16) | batch 16: tokens/s (x fp16) "
                    "| batch 64: tokens/s (x fp16) |")
    assert t[3].startswith(f"| {W4} | 333 (3.00x) | 4800 (3.00x) |")
    assert t[-1] == "| gemlite_w4 | skipped | skipped | skipped |"
    broken = [dict(r, error="boom", tokens_per_s=None) if r["variant"] == W4 else r for r in rows()]
    assert f"| {W4} | err | err | err |" in rep.speed_table(broken)
