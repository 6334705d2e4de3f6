"""One tuning DB file on disk (runtime/db_file.py), driven through TuningDB:
concurrent writers and lock-free readers, damaged and foreign files, the
cached read."""
import json
import multiprocessing
import warnings

import pytest

from opgen.codegen.buckets import LABELS
from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.runtime import db_file
from opgen.runtime.tuning_db import TuningDB, TuningDBError, make_key, make_record

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


def test_lookups_use_the_cache_until_the_file_changes(path, monkeypatch):
    db = TuningDB(path, shipped=False)
    db.put(key_for(), "1", rec())
    reads = []
    real = db_file.read_state
    monkeypatch.setattr(db_file, "read_state", lambda p: reads.append(p) or real(p))
    for _ in range(100):
        assert db.lookup(key_for(), "1") is not None
    assert len(reads) == 1
    TuningDB(path, shipped=False).put(key_for(), "2-4", rec())        # another writer
    assert db.lookup(key_for(), "2-4") is not None
