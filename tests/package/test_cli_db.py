"""`opgen db show|prune|export` (opgen/cli/db.py): what it lists and removes,
and every problem with a DB file as one line and exit status 2."""
import dataclasses
import json
import os
import warnings

import pytest

from opgen.cli import main
from opgen.codegen import planner
from opgen.codegen.resolve import as_spec
from opgen.runtime import tuner, tuning_db as tdb
from opgen.runtime.tuning_db import TuningDB, make_key, make_record

SPEC = as_spec("w4a16_sym_g128")                 # shipped: `db show --check` can render it
OTHER = dataclasses.replace(SPEC, name="w4a16_test")
CFG = planner.heuristic(SPEC, "sm_90", 16, 1024, 2048)


def key_for(spec=SPEC, N=1024, K=2048, device="NVIDIA H200"):
    return make_key(spec, N, K, arch="sm_90", device=device)


def rec(us=10.0, M=16, spec=SPEC):
    return make_record(CFG.to_dict(), us, M=M, runner_up_us=[us * 1.1], heuristic_us=us * 1.3,
                       config_name="cfg", nvrtc="12.9",
                       source_hash=tdb.rendered_hash(key_for(spec), CFG.to_dict()))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "sub" / "tuning.json"


@pytest.fixture
def opgen(capsys):
    """Run `opgen ARGS`: (exit status, stdout, stderr); no Python warning may
    escape (each problem is a line of its own)."""
    def run(*argv):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "Warning" not in err
        return rc, out, err
    return run


def add_old_record(path, key, bucket="1"):
    """A record of the old format (opgen and NVRTC versions in the key, no
    source hash), written as an older opgen did."""
    doc = json.loads(path.read_text())
    old_key = str(key).replace(f"|N{key.N}|", f"|0.1.0|nvrtc13.0|N{key.N}|")
    doc["records"][old_key] = {bucket: {f: v for f, v in rec(3.0).items() if f != "source_hash"}}
    path.write_text(json.dumps(doc))


def test_cli(path, tmp_path, opgen):
    db = TuningDB(path, shipped=False)
    db.put_many([(key_for(), "1", rec(2.0)), (key_for(OTHER), "1", rec(4.0, spec=OTHER))])
    add_old_record(path, key_for())

    rc, out, _ = opgen("db", "show", "--path", path, "--no-shipped")
    assert rc == 0 and "w4a16_sym_g128" in out and "speedup" in out and "1.30" in out
    assert "12.9" in out                                      # the NVRTC it was measured with
    rc, out, _ = opgen("db", "show", "--path", path, "--no-shipped", "--check")
    rows = [r.rsplit(None, 2) for r in out.splitlines()[3:]]  # [..., status, candidates, heuristic]
    statuses = ("current", "no source hash", "unknown spec")
    assert rc == 0 and sorted((next(s for s in statuses if rest.endswith(s)), cands, heur)
                              for rest, cands, heur in rows) == [
        ("current", "unknown", "unknown"), ("no source hash", "-", "-"), ("unknown spec", "-", "-")]
    # tuned among today's candidates, or among others (the planner offers new kernels since)
    M = rec()["M"]
    for digest, said in ((tuner.candidates_digest(tuner._candidates(SPEC, "sm_90", M, 1024, 2048)), "same"),
                         ("0" * 16, "changed")):
        db.put_many([(key_for(), "1", dict(rec(2.0), candidates=digest))])
        out = opgen("db", "show", "--path", path, "--no-shipped", "--check", "--spec", SPEC.name)[1]
        assert any(line.split()[-3:-1] == ["current", said] for line in out.splitlines()), out
    # whether heuristic_us timed today's pick (else its speedup is another pick's)
    pick = tuner._heuristic(SPEC, "sm_90", M, 1024, 2048).name
    for name, said in ((pick, "same"), ("gemm_other", "changed")):
        db.put_many([(key_for(), "1", dict(rec(2.0), heuristic_config=name))])
        out = opgen("db", "show", "--path", path, "--no-shipped", "--check", "--spec", SPEC.name)[1]
        assert any(line.split()[-1] == said and "current" in line for line in out.splitlines()), out
    assert "no records" in opgen("db", "show", "--path", path, "--spec", "nope")[1]
    rc, out, _ = opgen("db", "prune", "--path", path, "--dry-run")
    assert rc == 0 and out.count("would remove") == 1 and "(no source hash)" in out
    assert len(db.records()) == 3
    assert "removed 1" in opgen("db", "prune", "--path", path)[1]
    assert opgen("db", "export", tmp_path / "x.json", "--path", path)[0] == 0
    assert len(TuningDB(tmp_path / "x.json", shipped=False).records()) == 2
    assert "removed 1" in opgen("db", "prune", "--path", path, "--spec", "w4a16_test")[1]


def test_shipped_records_are_all_current(opgen, tmp_path):
    rc, out, err = opgen("db", "show", "--path", tmp_path / "none.json", "--check")
    rows = [line for line in out.splitlines() if line.startswith("shipped")]
    assert rc == 0 and not err and len(rows) > 500
    assert all(line.rsplit(None, 2)[0].endswith("current") for line in rows)
    # every shipped file (one per device)
    assert all(any(d in line for line in rows) for d in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"))


def test_show_a_corrupt_file(path, opgen):
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "opgen-tuning-db", "version": 1, "records": {')
    rc, out, err = opgen("db", "show", "--path", path, "--no-shipped")
    assert rc == 2 and "no records" in out
    assert err.count("\n") == 1 and str(path) in err and "unreadable" in err


def test_bad_records_are_reported_one_by_one(path, opgen):
    TuningDB(path, shipped=False).put(key_for(), "1", rec(2.0))
    doc = json.loads(path.read_text())
    doc["records"][str(key_for(N=8))] = {"1": {"median_us": 1.0}, "3": rec(),
                                         "2-4": dict(rec(), median_us=10 ** 400)}
    doc["records"]["garbage"] = {"1": rec()}                    # a key no lookup can name
    path.write_text(json.dumps(doc))
    # Export: the good record only, and each bad one said.
    rc, out, err = opgen("db", "export", path.with_name("out.json"), "--path", path)
    assert rc == 2 and len([ln for ln in err.splitlines() if "skipped" in ln and str(path) in ln]) == 4 \
        and len(TuningDB(path.with_name("out.json"), shipped=False).records()) == 1
    rc, out, err = opgen("db", "show", "--path", path, "--no-shipped")
    assert "w4a16_sym_g128" in out                               # the good one is listed
    lines = err.splitlines()
    assert len(lines) == 4 and all(str(path) in line and "skipped" in line for line in lines)
    # A write keeps the good records, says it copied the file aside, and the file is clean.
    rc, out, err = opgen("db", "prune", "--path", path, "--spec", "w4a16_sym_g128")
    assert rc == 0 and "removed 1" in out and "copied the file" in err
    assert opgen("db", "show", "--path", path, "--no-shipped")[0] == 0


def test_a_path_the_os_refuses_is_one_line(tmp_path, opgen):
    rc, out, err = opgen("db", "show", "--path", tmp_path / ("d" * 300))
    assert rc == 2 and err.startswith("opgen: error: --path: cannot use") and len(err.splitlines()) == 1


def test_prune_of_a_read_only_db_says_remove_of_nothing(path, opgen, monkeypatch):
    """(read-only simulated: root, which runs the tests in CI, may write anything)"""
    TuningDB(path, shipped=False).put(key_for(), "1", rec(2.0))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode & os.W_OK and str(p) == str(path)
                        else real_access(p, mode))
    rc, out, err = opgen("db", "prune", "--path", path, "--spec", "w4a16_sym_g128")
    assert rc == 2 and "remove" not in out and "read-only" in err
    assert len(TuningDB(path, shipped=False).records()) == 1


@pytest.mark.parametrize("command", [("show",), ("prune",), ("prune", "--spec", "x"),
                                     ("export", "OUT")])
def test_filesystem_errors_exit_2_in_one_line(tmp_path, opgen, command):
    folder = tmp_path / "a_dir.json"
    folder.mkdir()
    db_path = tmp_path / "ok.json"
    TuningDB(db_path, shipped=False).put(key_for(), "1", rec())
    # The DB a directory; for export, its output.
    argv = ["db", *command, "--path", folder] if command[0] != "export" else \
        ["db", "export", folder, "--path", db_path]
    rc, out, err = opgen(*argv)
    assert rc == 2 and err.count("\n") == 1 and str(folder) in err and "directory" in err


def test_a_file_that_is_not_a_db_is_never_overwritten(path, opgen):
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    for argv in (("prune",), ("prune", "--spec", "x")):
        rc, _, err = opgen("db", *argv, "--path", path)
        assert rc == 2 and "never overwritten" in err
    other = path.parent / "other.json"
    TuningDB(other, shipped=False).put(key_for(), "1", rec())
    rc, _, err = opgen("db", "export", path, "--path", other)
    assert rc == 2 and "refusing to write" in err
    assert path.read_text() == "[]"
