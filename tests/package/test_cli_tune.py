"""`opgen tune` (opgen/cli/tune.py): its arguments and their errors, what
it hands runtime.tuner.tune_many (with --model: a config's linear shapes)
or, with --gpus / --ray, runtime.tune_pool.tune_pairs, what a rerun skips,
and the report it prints."""
import json

import pytest

from opgen.bench.plan import matmul_specs, shipped_matmul_specs
from opgen.cli import main
from opgen.cli.tune import report
from opgen.codegen import planner
from opgen.runtime import tune_pool, tuner, tuning_db
from opgen.runtime.device import has_gpu
from opgen.runtime.tune_ray import RayWorkers
from opgen.runtime.tuning_db import TuningDB, make_key, make_record


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch):
    """As on a machine with one GPU (or none): tune_many in this process."""
    monkeypatch.setattr(tune_pool, "visible_gpus", lambda: ["0"])


@pytest.mark.parametrize("argv, msg", [
    ([], "no spec"),
    (["gptq_v2_w4a16_g128"], "no shape"),
    (["gptq_v2_w4a16_g128", "--N", "4096"], "--N and --K go together"),
    (["gptq_v2_w4a16_g128", "--N", "4096", "--K", "4096", "--shapes", "8192x8192"],
     "--shapes and --N/--K both given"),
    (["--all", "gptq_v2_w4a16_g128", "--shapes", "4096x4096"], "not both"),
    (["quantize_int8_row", "--shapes", "4096x4096"], "is not a matmul; opgen tune"),
    (["gptq_v2_w4a16_g128", "--shapes", "4096x4100"], "K=4100 must be a multiple"),
    (["gptq_v2_w4a16_g128", "--shapes", "4096x"], "argument --shapes"),
    (["gptq_v2_w4a16_g128", "--shapes", "4096x4096", "--M", "1,x"], "argument --M"),
    (["gptq_v2_w4a16_g128", "--shapes", "4096x4096", "--finalists", "0"], "argument --finalists"),
    (["gptq_v2_w4a16_g128", "--shapes", "4096x4096", "--rank-budget-ms", "0"],
     "argument --rank-budget-ms"),
])
def test_cli_rejects_bad_input(argv, msg, capsys, monkeypatch):
    monkeypatch.setattr(tuner, "tune_many", lambda *a, **k: pytest.fail("must not start"))
    try:
        rc = main(["tune", *argv])
    except SystemExit as e:               # argparse's usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_cli_resolves_specs_and_shapes(capsys, monkeypatch, tmp_path):
    calls = []

    def fake(specs, shapes, **kw):
        calls.append(([s.name for s in specs], shapes, kw))
        res = tuner.TuneResults("key", specs[0].name, *shapes[0])
        return tuner.TuneRun([res])
    monkeypatch.setattr(tuner, "tune_many", fake)
    db = str(tmp_path / "db.json")
    assert main(["tune", "--all", "--shapes", "4096x4096,8192x8192", "--M", "1,16", "--db", db,
                 "--budget-ms", "10", "--rank-budget-ms", "2", "--finalists", "5"]) == 0
    names, shapes, kw = calls[-1]
    assert names == shipped_matmul_specs() and len(names) == 20
    assert shapes == [(4096, 4096), (8192, 8192)] and kw["Ms"] == [1, 16]
    assert (kw["budget_ms"], kw["rank_budget_ms"], kw["finalists"], kw["db"]) == (10.0, 2.0, 5, db)
    # the old one-shape form, and several specs (duplicates dropped)
    assert main(["tune", "gptq_v2_w4a16_g128", "bnb_nf4", "gptq_v2_w4a16_g128",
                 "--N", "8192", "--K", "8192", "--db", db]) == 0
    assert calls[-1][:2] == (["gptq_v2_w4a16_g128", "bnb_nf4"], [(8192, 8192)])
    assert calls[-1][2]["budget_ms"] == tuner.BUDGET_MS
    assert calls[-1][2]["finalists"] == tuner.FINALISTS
    assert "total " in capsys.readouterr().out


def test_report():
    res = tuner.TuneResults("key|of|the|pair", "w4a16_fake", 1024, 1024)
    res["1"] = make_record({"name": "a"}, 5.0, M=1, heuristic_us=10.5, config_name="a")
    res["33-64"] = make_record({"name": "a"}, 5.0, M=64, heuristic_us=5.0, config_name="a")
    res.launch_failed["nolaunch"] = "RuntimeError: CUDA_ERROR_INVALID_VALUE"
    res.seconds = 1.5
    bad = tuner.TuneResults("k2", "w8a16_fake", 1024, 1024)
    bad.error = "setup failed: RuntimeError: out of memory"
    run = tuner.TuneRun([res, bad], kernels=10, kernels_failed=2, total_s=3.0)
    text = report(run, "/tmp/db.json")
    lines = text.splitlines()
    assert lines[0] == "== w4a16_fake  N=1024 K=1024  (1.5 s)"
    assert lines[1].split() == ["bucket", "M", "best", "config", "us", "heuristic", "us", "speedup"]
    assert lines[3].split() == ["1", "1", "a", "5.00", "10.50", "2.10"]
    assert lines[4].split() == ["33-64", "64", "a", "5.00", "5.00", "1.00"]
    assert "1 config(s) failed to launch: nolaunch: RuntimeError: CUDA_ERROR_INVALID_VALUE" in text
    assert "== w8a16_fake  N=1024 K=1024: NOT tuned (setup failed: RuntimeError: out of memory)" in text
    assert "stored 2 record(s) of 2 bucket(s), 2 (spec, shape) pair(s), in /tmp/db.json" in text
    assert ("heuristic / tuned: median 1.55x, worst 2.10x (w4a16_fake 1024x1024 1); "
            "1 of 2 bucket(s) over 1.15x") in text
    assert lines[-1].startswith("total ") and "compiling 10 kernels" in lines[-1]


# --- --model: a Hugging Face config's linear shapes ------------------------------------------

LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
               "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
               "num_local_experts": 32, "vocab_size": 201088}


def _record_calls(monkeypatch):
    calls = []

    def fake(specs, shapes, **kw):
        calls.append(([s.name for s in specs], list(shapes), kw))
        return tuner.TuneRun([tuner.TuneResults("key", s.name, N, K) for s in specs for N, K in shapes],
                             kernels=2, total_s=1.0)
    monkeypatch.setattr(tuner, "tune_many", fake)
    return calls


def test_model_tunes_every_distinct_linear_shape(capsys, monkeypatch, tmp_path):
    calls = _record_calls(monkeypatch)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    db = str(tmp_path / "db.json")
    assert main(["tune", "gptq_v2_w4a16_g128", "bnb_nf4", "--model", str(tmp_path), "--M", "1,16",
                 "--no-fused", "--db", db]) == 0
    shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
    assert calls == [(["gptq_v2_w4a16_g128", "bnb_nf4"], shapes, calls[0][2])]   # one call
    assert calls[0][2]["Ms"] == [1, 16] and calls[0][2]["db"] == db
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path / 'config.json'}: 4 distinct linear shape(s) (N x K): "
                          "4096x4096 (self_attn.q_proj, self_attn.o_proj); 1024x4096")
    assert "stored 0 record(s) of 0 bucket(s), 8 (spec, shape) pair(s)" in out
    # lm_head on request, from the config file itself
    main(["tune", "w8a8_int8", "--model", str(tmp_path / "config.json"), "--lm-head", "--no-fused",
          "--db", db])
    assert calls[-1][:2] == (["w8a8_int8"], shapes + [(128256, 4096)])
    # by default the wider layers of fused siblings too (what the loaders run)
    for fused in ([], ["--fused"]):
        main(["tune", "w8a8_int8", "--model", str(tmp_path / "config.json"), "--db", db] + fused)
        assert calls[-1][:2] == (["w8a8_int8"], shapes + [(6144, 4096), (28672, 4096)])
    # but not for a spec whose layers never stack (a tensor scale)
    main(["tune", "bitnet_b158", "--model", str(tmp_path / "config.json"), "--db", db])
    assert calls[-1][:2] == (["bitnet_b158"], shapes)
    assert "skipped bitnet_b158 at the fused siblings' shape(s) 6144x4096, 28672x4096: fuse: bitnet_b158: " \
        in capsys.readouterr().out


def test_model_shapes_a_spec_refuses_are_skipped(capsys, monkeypatch, tmp_path):
    """gpt-oss-20b's K = 2880 is not a multiple of 128: the g128 spec takes
    only its 4096-wide o_proj, mxfp4 (group 32) all; specs taking the same
    shapes share a call, the runs are reported as one."""
    calls = _record_calls(monkeypatch)
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    assert main(["tune", "gptq_v2_w4a16_g128", "mxfp4", "w8a8_int8", "--model", str(tmp_path),
                 "--db", str(tmp_path / "db.json"), "--quiet"]) == 0
    every = [(4096, 2880), (512, 2880), (2880, 4096), (5760, 2880), (2880, 2880), (5120, 2880)]   # (q+k+v)
    assert [c[:2] for c in calls] == [(["gptq_v2_w4a16_g128"], [(2880, 4096)]),
                                      (["mxfp4", "w8a8_int8"], every)]
    out = capsys.readouterr().out
    assert "skipped gptq_v2_w4a16_g128 at N=4096 K=2880: " in out and "128" in out
    assert "pair(s)" in out and "compiling 4 kernels" in out         # the merged report
    # nothing fits: one error line
    (tmp_path / "odd.json").write_text(json.dumps(dict(GPT_OSS_20B, head_dim=33)))
    rc = main(["tune", "gptq_v2_w4a16_g128", "--model", str(tmp_path / "odd.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "no shape of its linear layers fits" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, msg", [
    (["--model", "{d}", "--shapes", "4096x4096"], "--model and --shapes/--N/--K both given"),
    (["--shapes", "4096x4096", "--lm-head"], "--lm-head goes with --model"),
    (["--shapes", "4096x4096", "--fused"], "--fused / --no-fused go with --model"),
    (["--shapes", "4096x4096", "--no-fused"], "--fused / --no-fused go with --model"),
    (["--model", "{d}/nothere.json"], "nothere.json: neither a shipped model"),
    (["--model", "{d}/bad.json"], "bad.json: hidden_size: missing"),
    (["--model", "m" * 300], "cannot use this path (File name too long)"),
])
def test_model_errors(argv, msg, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tuner, "tune_many", lambda *a, **k: pytest.fail("must not start"))
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    (tmp_path / "bad.json").write_text(json.dumps({"model_type": "llama"}))
    rc = main(["tune", "bnb_nf4", *[a.replace("{d}", str(tmp_path)) for a in argv]])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_without_a_gpu_one_line(capsys, tmp_path):
    """No GPU here: the tuner's NoGPUError is one line (status 1, as for
    every missing-CUDA error of the CLI), after the model's shapes."""
    if has_gpu():
        pytest.skip("has a GPU")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    rc = main(["tune", "bnb_nf4", "--model", str(tmp_path), "--db", str(tmp_path / "db.json"),
               "--quiet", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("opgen: error: ") and len(err.splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("content", ["[1, 2]", None])
def test_a_db_it_cannot_write_is_refused_before_tuning(content, capsys, monkeypatch, tmp_path):
    """--db that a write would refuse (another JSON file; a path under a
    file): one line naming --db, status 2, before any tuning, the file
    untouched."""
    monkeypatch.setattr(tuner, "tune_many", lambda *a, **k: pytest.fail("tuned"))
    if content is None:
        (tmp_path / "afile").write_text("x")
        db = tmp_path / "afile" / "db.json"
    else:
        db = tmp_path / "db.json"
        db.write_text(content)
    rc = main(["tune", "bnb_nf4", "--shapes", "4096x4096", "--db", str(db), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("opgen: error: --db: ") and len(err.splitlines()) == 1, err
    assert content is None or db.read_text() == content


# --- several GPUs, Ray, resume -------------------------------------------------------

def _record_pool(monkeypatch, device="Fake GPU"):
    calls = []

    def fake(pairs, backend, **kw):
        calls.append(([(s.name, N, K) for s, N, K in pairs], backend, kw))
        outs = [tune_pool.Outcome(tune_pool.Task(i, s, N, K), f"gpu{i % 2}", device,
                                  tuner.TuneResults("key", s.name, N, K))
                for i, (s, N, K) in enumerate(pairs)]
        outs[-1].results = None                               # skipped: in the DB already
        return tune_pool.PoolRun(outs, total_s=2.0)
    monkeypatch.setattr(tune_pool, "tune_pairs", fake)
    monkeypatch.setattr(tuner, "tune_many", lambda *a, **k: pytest.fail("not in process"))
    return calls


def test_gpus_run_a_worker_per_gpu(capsys, monkeypatch, tmp_path):
    calls = _record_pool(monkeypatch)
    db = str(tmp_path / "db.json")
    assert main(["tune", "bnb_nf4", "mxfp4", "--shapes", "4096x4096", "--M", "1,16", "--db", db,
                 "--gpus", "0,1", "--force", "--finalists", "3"]) == 0
    pairs, backend, kw = calls[-1]
    assert pairs == [("bnb_nf4", 4096, 4096), ("mxfp4", 4096, 4096)]
    assert isinstance(backend, tune_pool.LocalWorkers) and backend.gpus == ["0", "1"]
    assert (kw["Ms"], kw["db"], kw["force"], kw["finalists"], kw["workers"]) == \
        ([1, 16], db, True, 3, None)
    out = capsys.readouterr().out
    assert "== bnb_nf4  N=4096 K=4096" in out and "== mxfp4" not in out
    assert "skipped 1 pair(s) the DB already has for their device" in out
    assert "mxfp4 4096x4096 (Fake GPU)" in out
    summary = out[out.index("per device:"):].splitlines()
    assert summary[1].split() == ["device", "workers", "tuned", "partly", "failed", "skipped",
                                  "records", "busy", "s"]
    assert summary[3].split()[:4] == ["Fake", "GPU", "gpu0,", "gpu1"]


@pytest.mark.parametrize("argv, address", [(["--ray"], None), (["--ray", "auto"], "auto")])
def test_ray_address(argv, address, capsys, monkeypatch):
    calls = _record_pool(monkeypatch)
    assert main(["tune", "bnb_nf4", "--shapes", "4096x4096", *argv, "--quiet"]) == 0
    backend = calls[-1][1]
    assert isinstance(backend, RayWorkers) and backend.address == address
    assert calls[-1][2]["progress"] is False


def test_ray_and_gpus_exclusive(capsys, monkeypatch):
    _record_pool(monkeypatch)
    assert main(["tune", "bnb_nf4", "--shapes", "4096x4096", "--ray", "--gpus", "0,1"]) == 2
    assert "--gpus is for local workers" in capsys.readouterr().err


def test_rerun_skips_what_the_db_has_for_this_gpu(capsys, monkeypatch, tmp_path):
    """In process (one GPU): a pair whose every requested bucket the DB has
    for this GPU, tuned among today's candidates, is skipped; --force tunes
    it again, and so does a record tuned among other candidates (a planner
    that offers new kernels since) or before records kept their fingerprint."""
    calls = _record_calls(monkeypatch)
    monkeypatch.setattr(tune_pool, "device_here", lambda arch=None: ("sm_90", "Fake GPU"))
    monkeypatch.setattr(tuning_db, "rendered_hash", lambda key, config: "src")
    db = tmp_path / "db.json"
    [gptq] = matmul_specs(["gptq_v2_w4a16_g128"])
    key = make_key(planner.execution_spec(gptq, "sm_90"), 4096, 4096, arch="sm_90",
                   device="Fake GPU")
    run = planner.execution_spec(gptq, "sm_90")

    def store(**fingerprint):
        TuningDB(db, shipped=False).put_many(
            (key, b, make_record({"name": "x"}, 1.0, M=M, source_hash="src", **{
                k: v(M) for k, v in fingerprint.items()}))
            for b, M in (("1", 1), ("9-16", 16)))
    now = lambda M: tuner.candidates_digest(tuner._candidates(run, "sm_90", M, 4096, 4096))
    for stale in ({}, {"candidates": lambda M: "0" * 16}):
        store(**stale)
        calls.clear()
        assert main(["tune", "gptq_v2_w4a16_g128", "--shapes", "4096x4096", "--M", "1,16",
                     "--db", str(db)]) == 0
        assert [c[:2] for c in calls] == [(["gptq_v2_w4a16_g128"], [(4096, 4096)])], stale
    store(candidates=now)
    calls.clear()
    argv = ["tune", "gptq_v2_w4a16_g128", "bnb_nf4", "--shapes", "4096x4096,8192x8192",
            "--M", "1,16", "--db", str(db)]
    assert main(argv) == 0
    assert [c[:2] for c in calls] == [(["gptq_v2_w4a16_g128"], [(8192, 8192)]),
                                      (["bnb_nf4"], [(4096, 4096), (8192, 8192)])]
    out = capsys.readouterr().out
    assert "skipped 1 pair(s) the DB already has for their device" in out
    assert "gptq_v2_w4a16_g128 4096x4096 (Fake GPU)" in out
    # a bucket the DB lacks (M=64): tuned; and --force: everything, in one call
    for extra in (["--M", "1,64"], ["--force"]):
        calls.clear()
        assert main(argv + extra) == 0
        assert [c[:2] for c in calls] == [(["gptq_v2_w4a16_g128", "bnb_nf4"],
                                           [(4096, 4096), (8192, 8192)])]
