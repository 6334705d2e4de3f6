"""The tuning DB (CPU only): storage, concurrency, damaged files, keys, buckets."""
import argparse
import dataclasses
import json
import multiprocessing
import os
import time
import warnings

import pytest

from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.runtime import tuning_db as tdb
from opgen.codegen.buckets import BUCKETS, LABELS, bucket_of, representative_M
from opgen.runtime.tuning_db import DBKey, TuningDB, TuningDBError, make_key, make_record

SPEC = Spec(name="w4a16_test", op="matmul", a=Activation("float16"),
            b=Weight("uint4", scale=Scale("float16", "group", 128)), out=Output("float16"))


def key_for(spec=SPEC, N=1024, K=2048, version="0.1.0", device="NVIDIA H200"):
    return make_key(spec, N, K, arch="sm_90", device=device, nvrtc="12.9", version=version)


def rec(us=10.0, M=16, **cfg):
    return make_record(cfg or {"bm": 16, "bn": 128}, us, M=M, runner_up_us=[us * 1.1],
                       heuristic_us=us * 1.3, config_name="cfg")


@pytest.fixture
def path(tmp_path):
    return tmp_path / "sub" / "tuning.json"


def test_round_trip(path):
    key = key_for()
    db = TuningDB(path, shipped=False)
    assert db.lookup(key, "9-16") is None                 # no file yet
    db.put(key, "9-16", rec(12.5, bm=16))
    db.put_many([(key, "1", rec(3.0, M=1, bm=1)), (str(key), ">1024", rec(900.0, M=4096, bm=128))])

    fresh = TuningDB(path, shipped=False)
    got = fresh.lookup(key, "9-16")
    assert got["config"] == {"bm": 16} and got["median_us"] == 12.5 and got["M"] == 16
    assert got["runner_up_us"] == [13.75] and got["heuristic_us"] == 16.25
    assert "T" in got["measured_at"]
    assert fresh.lookup(str(key), "1")["config"] == {"bm": 1}
    assert set(fresh.lookup_all(key)) == {"1", "9-16", ">1024"}
    assert fresh.lookup(key, "2-4") is None
    assert [(e.bucket, e.source) for e in fresh.records()] == [("1", "user"), ("9-16", "user"),
                                                               (">1024", "user")]
    # One readable JSON document, buckets in M order.
    text = path.read_text()
    doc = json.loads(text)
    assert doc["format"] == "opgen-tuning-db" and doc["version"] == 1
    assert list(doc["records"][str(key)]) == ["1", "9-16", ">1024"]
    assert "\n  " in text
    assert not list(path.parent.glob("*.tmp"))             # the temp file was renamed
    # Results handed out are copies: editing one does not change the DB.
    got["config"]["bm"] = 999
    assert fresh.lookup(key, "9-16")["config"] == {"bm": 16}


def test_put_rejects_bad_input(path):
    db = TuningDB(path, shipped=False)
    with pytest.raises(ValueError, match="bucket"):
        db.put(key_for(), "3", rec())
    with pytest.raises(ValueError, match="config"):
        db.put(key_for(), "1", {"median_us": 1.0})
    assert not path.exists()


def _writer(path, tag, n, barrier):
    db = TuningDB(path, shipped=False)
    barrier.wait()
    for i in range(n):
        db.put(key_for(N=64 * (i + 1), device=f"GPU {tag}"), LABELS[i % len(LABELS)], rec(float(i)))


def _reader(path, stop, errors):
    # Reads take no lock: every read must still see a whole, valid file.
    while not stop.is_set():
        try:
            with open(path) as f:
                doc = json.load(f)
            assert doc["format"] == "opgen-tuning-db"
        except FileNotFoundError:
            pass
        except Exception as e:                   # pragma: no cover - the failure case
            errors.put(repr(e))
            return


def test_concurrent_writers_lose_nothing(path):
    ctx = multiprocessing.get_context("fork")
    barrier, stop, errors = ctx.Barrier(2), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(path, stop, errors))
    writers = [ctx.Process(target=_writer, args=(path, tag, 50, barrier)) for tag in "AB"]
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    stop.set()
    reader.join(10)
    assert all(w.exitcode == 0 for w in writers)
    assert errors.empty(), errors.get()
    entries = TuningDB(path, shipped=False).records()
    assert len(entries) == 100
    assert {e.key.split("|")[3] for e in entries} == {"GPU A", "GPU B"}


def test_corrupted_file(path):
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "opgen-tuning-db", "version": 1, "records": {')   # truncated
    db = TuningDB(path, shipped=False)
    with pytest.warns(RuntimeWarning, match=r"unreadable.*corrupt-"):
        assert db.lookup(key_for(), "1") is None
    with warnings.catch_warnings():                       # warned once, not on every lookup
        warnings.simplefilter("error")
        assert db.lookup(key_for(), "1") is None
        assert db.records() == []

    with pytest.warns(RuntimeWarning, match="copied it to"):
        db.put(key_for(), "1", rec())
    backups = list(path.parent.glob("tuning.json.corrupt-*"))
    assert len(backups) == 1
    assert backups[0].read_text().endswith('"records": {')      # the original bytes, kept
    assert TuningDB(path, shipped=False).lookup(key_for(), "1")["median_us"] == 10.0


@pytest.mark.parametrize("doc", [
    [1, 2],
    {"format": "opgen-tuning-db", "version": 1, "records": []},
    {"format": "opgen-tuning-db", "version": 1, "records": {"k": {"1": {"median_us": 1}}}},
])
def test_wrong_shape_is_corrupt(path, doc):
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert TuningDB(path, shipped=False).lookup(key_for(), "1") is None


@pytest.mark.parametrize("doc", [
    {"format": "opgen-tuning-db", "version": 2, "records": {}},
    {"format": "something-else", "version": 1},
    {"unrelated": "settings"},
])
def test_foreign_file_is_never_overwritten(path, doc):
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    db = TuningDB(path, shipped=False)
    with pytest.warns(RuntimeWarning, match="another path"):
        assert db.lookup(key_for(), "1") is None
    with pytest.raises(TuningDBError, match="another path"):
        db.put(key_for(), "1", rec())
    with pytest.raises(TuningDBError):
        db.prune(lambda *a: True)
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.corrupt-*"))


def test_key_changes_with_spec_version_device(path):
    db = TuningDB(path, shipped=False)
    db.put(key_for(), "1", rec())
    assert db.lookup(key_for(), "1") is not None
    changed = dataclasses.replace(SPEC, out=Output("bfloat16"))
    renamed_only_description = dataclasses.replace(SPEC, description="new words")
    assert changed.content_hash() != SPEC.content_hash()
    assert db.lookup(key_for(spec=changed), "1") is None
    assert db.lookup(key_for(version="0.2.0"), "1") is None
    assert db.lookup(key_for(device="NVIDIA H100 80GB HBM3"), "1") is None
    assert db.lookup(key_for(N=2048), "1") is None
    assert db.lookup(key_for(spec=renamed_only_description), "1") is not None


def test_key_string_form():
    k = key_for()
    s = str(k)
    assert s == f"w4a16_test|{SPEC.content_hash()}|sm_90|NVIDIA H200|0.1.0|nvrtc12.9|N1024|K2048"
    assert DBKey.parse(s) == k
    with pytest.raises(ValueError):
        DBKey.parse("not|a|key")
    assert "|" not in make_key(SPEC, 1, 1, arch="sm_90", device="odd|name", nvrtc="12.9").device


def test_shipped_db_is_consulted_after_the_user_file(tmp_path, path):
    shipped = tmp_path / "shipped.json"
    TuningDB(shipped, shipped=False).put_many(
        [(key_for(), "1", rec(5.0, bm=1)), (key_for(), "2-4", rec(6.0, bm=2))])
    db = TuningDB(path, shipped=shipped)
    assert db.lookup(key_for(), "1")["config"] == {"bm": 1}
    db.put(key_for(), "1", rec(4.0, bm=11))
    assert db.lookup(key_for(), "1")["config"] == {"bm": 11}         # user wins
    assert db.lookup(key_for(), "2-4")["config"] == {"bm": 2}
    assert {b: r["config"]["bm"] for b, r in db.lookup_all(key_for()).items()} == {"1": 11, "2-4": 2}
    assert len(db.records("all")) == 3 and len(db.records("shipped")) == 2
    assert len(json.loads(shipped.read_text())["records"][str(key_for())]) == 2   # untouched


def test_packaged_shipped_db_is_optional(path):
    db = TuningDB(path)                 # shipped=True: opgen/data/tuned_h200.json if present
    assert db.lookup(key_for(), "1") is None


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.delenv("OPGEN_TUNING_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert tdb.default_path() == tmp_path / "cache" / "opgen" / "tuning.json"
    monkeypatch.setenv("OPGEN_TUNING_DB", str(tmp_path / "mine.json"))
    assert TuningDB().path == tmp_path / "mine.json"
    assert TuningDB(tmp_path / "arg.json").path == tmp_path / "arg.json"


def test_lookups_use_the_cache_until_the_file_changes(path, monkeypatch):
    db = TuningDB(path, shipped=False)
    db.put(key_for(), "1", rec())
    reads = []
    real = tdb._read_state
    monkeypatch.setattr(tdb, "_read_state", lambda p: reads.append(p) or real(p))
    for _ in range(100):
        assert db.lookup(key_for(), "1") is not None
    assert len(reads) == 1
    TuningDB(path, shipped=False).put(key_for(), "2-4", rec())        # another writer
    assert db.lookup(key_for(), "2-4") is not None


def test_prune_and_export(path, tmp_path):
    db = TuningDB(path, shipped=False)
    other = dataclasses.replace(SPEC, name="other_spec")
    db.put_many([(key_for(), "1", rec()), (key_for(), "2-4", rec()),
                 (key_for(version="0.0.9"), "1", rec()),
                 (key_for(spec=other), "1", rec())])
    db.put(key_for(N=1), "1", rec())
    assert db.prune(tdb.stale("0.1.0", {"other_spec": "0000"})) == 2   # old version, changed spec
    assert {e.key for e in db.records()} == {str(key_for()), str(key_for(N=1))}
    assert db.prune(lambda k, b, r: b == "2-4") == 1
    mtime = path.stat().st_mtime_ns
    assert db.prune(lambda k, b, r: False) == 0
    assert path.stat().st_mtime_ns == mtime                           # nothing removed: no write
    out = tmp_path / "export.json"
    assert db.export(out) == 2
    assert TuningDB(out, shipped=False).lookup(key_for(), "1") is not None


def test_cli(path, tmp_path, capsys):
    db = TuningDB(path, shipped=False)
    db.put_many([(key_for(), "1", rec(2.0)), (key_for(version="0.0.1"), "1", rec(3.0))])
    parser = argparse.ArgumentParser(prog="opgen")
    tdb.add_cli(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args(list(argv))
        assert args.func(args) == 0
        return capsys.readouterr().out

    out = run("db", "show", "--path", str(path), "--no-shipped")
    assert "w4a16_test" in out and "speedup" in out and "1.30" in out
    assert "no records" in run("db", "show", "--path", str(path), "--spec", "nope")
    assert "would remove" in run("db", "prune", "--path", str(path), "--dry-run")
    assert len(db.records()) == 2
    assert "removed 1" in run("db", "prune", "--path", str(path))
    run("db", "export", str(tmp_path / "x.json"), "--path", str(path))
    assert len(TuningDB(tmp_path / "x.json", shipped=False).records()) == 1
    assert "removed 1" in run("db", "prune", "--path", str(path), "--spec", "w4a16_test")


# --- buckets ----------------------------------------------------------------------

def test_bucket_boundaries():
    assert bucket_of(1) == "1"
    for lo, hi, label in BUCKETS:
        assert bucket_of(lo) == label
        if hi is not None:
            assert bucket_of(hi) == label
            assert bucket_of(hi + 1) != label
        assert bucket_of(representative_M(label)) == label
    assert bucket_of(1024) == "513-1024" and bucket_of(1025) == ">1024"
    assert bucket_of(10 ** 6) == ">1024"
    assert [representative_M(b) for b in LABELS] == [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024,
                                                    4096]
    for bad in (0, -1):
        with pytest.raises(ValueError):
            bucket_of(bad)
    with pytest.raises(ValueError):
        representative_M("3-7")


def test_bucket_of_is_fast():
    t0 = time.perf_counter()
    for m in range(1, 100_001):
        bucket_of(m & 1023 or 1)
    assert time.perf_counter() - t0 < 0.2
