"""`opgen tune` (opgen/cli/tune.py): its arguments and their errors, what
it hands runtime.tuner.tune_many, and the report it prints."""
import pytest

from opgen.bench.plan import shipped_matmul_specs
from opgen.cli import main
from opgen.cli.tune import report
from opgen.runtime import tuner
from opgen.runtime.tuning_db import make_record


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
    assert names == shipped_matmul_specs() and len(names) == 15
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
    assert lines[-1].startswith("total ") and "compiling 10 kernels" in lines[-1]
