"""The tuning DB (CPU only): keys, records, the shipped DBs per device,
pruning and exporting.  The file on disk: test_db_file.py; `opgen db`:
tests/package/test_cli_db.py."""
import dataclasses
import json

import pytest

from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.runtime import tuning_db as tdb
from opgen.runtime.tuning_db import DBKey, TuningDB, make_key, make_record

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
    db = TuningDB(path)                 # shipped=True: opgen/data/tuning/<device>.json if present
    assert db.lookup(key_for(), "1") is None


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.delenv("OPGEN_TUNING_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert tdb.default_path() == tmp_path / "cache" / "opgen" / "tuning.json"
    monkeypatch.setenv("OPGEN_TUNING_DB", str(tmp_path / "mine.json"))
    assert TuningDB().path == tmp_path / "mine.json"
    assert TuningDB(tmp_path / "arg.json").path == tmp_path / "arg.json"


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


def test_shipped_db_per_device(tmp_path, path, monkeypatch):
    """shipped=True: the file of each key's device under the package's
    tuning folder (nvidia_h200.json for "NVIDIA H200"), read only when a key
    of that device is looked up; records("shipped") lists every file."""
    assert tdb.device_file("NVIDIA H200") == "nvidia_h200.json"
    assert tdb.device_file("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3.json"
    folder = tmp_path / "tuning"
    folder.mkdir()
    TuningDB(folder / "nvidia_h200.json", shipped=False).put(key_for(), "1", rec(5.0, bm=1))
    h100 = key_for(device="NVIDIA H100 80GB HBM3")
    TuningDB(folder / "nvidia_h100_80gb_hbm3.json", shipped=False).put(h100, "1", rec(7.0, bm=2))
    monkeypatch.setattr(tdb, "shipped_dir", lambda: folder)
    db = TuningDB(path)
    assert db.lookup(key_for(), "1")["config"] == {"bm": 1}
    assert db.lookup(h100, "1")["config"] == {"bm": 2}
    assert db.lookup(key_for(device="NVIDIA A100"), "1") is None        # nothing shipped for it
    assert db.lookup("not a key", "1") is None
    assert len(db.records("shipped")) == 2


def test_the_h200_db_ships():
    """The package's DB for the device the shipped kernels were tuned on,
    with records of that device only."""
    p = tdb.shipped_path(tdb.REFERENCE_DEVICE)
    assert p is not None and p.name == "nvidia_h200.json" and p in tdb.shipped_paths()
    keys = json.loads(p.read_text())["records"]
    assert keys and {DBKey.parse(k).device for k in keys} == {tdb.REFERENCE_DEVICE}
