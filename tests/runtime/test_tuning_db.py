"""The tuning DB (CPU only): keys, records checked against the code they were
measured on, the shipped DBs per device, pruning and exporting.  The file on
disk: test_db_file.py; `opgen db`: tests/package/test_cli_db.py."""
import dataclasses
import json
import time

import pytest

from opgen.codegen import planner, render
from opgen.codegen.resolve import as_spec
from opgen.codegen.spec import Output
from opgen.runtime import db_file
from opgen.runtime.op import MatmulOp
from opgen.runtime import tuning_db as tdb
from opgen.runtime.tuning_db import DBKey, TuningDB, make_key, make_record

# A real spec under a name that is not shipped: its records render.
SPEC = dataclasses.replace(as_spec("w4a16_sym_g128"), name="w4a16_test")
ARCH = "sm_90"
CFGS = planner.candidates(SPEC, ARCH, 16, 1024, 2048)[:3]


def key_for(spec=SPEC, N=1024, K=2048, device="NVIDIA H200"):
    return make_key(spec, N, K, arch=ARCH, device=device)


def rec(us=10.0, M=16, cfg=CFGS[0], spec=SPEC):
    """A record of cfg as the tuner makes it: with its source hash."""
    return make_record(cfg.to_dict(), us, M=M, runner_up_us=[us * 1.1], heuristic_us=us * 1.3,
                       config_name=cfg.name, nvrtc="12.9",
                       source_hash=tdb.rendered_hash(key_for(spec), cfg.to_dict()))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "sub" / "tuning.json"


def write_records(path, records):
    """A DB file holding `records` as they are, past put's checks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(db_file.document(records)))


def test_round_trip(path):
    key = key_for()
    db = TuningDB(path, shipped=False)
    assert db.lookup(key, "9-16") is None                 # no file yet
    db.put(key, "9-16", rec(12.5, cfg=CFGS[0]))
    db.put_many([(key, "1", rec(3.0, M=1, cfg=CFGS[1])),
                 (str(key), ">1024", rec(900.0, M=4096, cfg=CFGS[2]))])

    fresh = TuningDB(path, shipped=False)
    got = fresh.lookup(key, "9-16")
    assert got["config"] == CFGS[0].to_dict() and got["median_us"] == 12.5 and got["M"] == 16
    assert got["runner_up_us"] == [13.75] and got["heuristic_us"] == 16.25
    assert "T" in got["measured_at"] and got["nvrtc"] == "12.9" and got["opgen"]
    assert fresh.lookup(key, "1")["config_name"] == CFGS[1].name
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
    got["config"]["BM"] = 999
    assert fresh.lookup(key, "9-16")["config"] == CFGS[0].to_dict()


def test_put_rejects_bad_input(path):
    db = TuningDB(path, shipped=False)
    with pytest.raises(ValueError, match="bucket"):
        db.put(key_for(), "3", rec())
    with pytest.raises(ValueError, match="config"):
        db.put(key_for(), "1", {"median_us": 1.0, "source_hash": "x"})
    with pytest.raises(ValueError, match="source_hash"):         # it could never be served
        db.put(key_for(), "1", make_record(CFGS[0].to_dict(), 1.0, M=1))
    assert not path.exists()


def test_key_changes_with_spec_device_shape(path):
    db = TuningDB(path, shipped=False)
    db.put(key_for(), "1", rec())
    assert db.lookup(key_for(), "1") is not None
    changed = dataclasses.replace(SPEC, out=Output("bfloat16"))
    renamed_only_description = dataclasses.replace(SPEC, description="new words")
    assert changed.content_hash() != SPEC.content_hash()
    assert db.lookup(key_for(spec=changed), "1") is None
    assert db.lookup(key_for(device="NVIDIA H100 80GB HBM3"), "1") is None
    assert db.lookup(key_for(N=2048), "1") is None
    assert db.lookup(key_for(spec=renamed_only_description), "1") is not None


def test_key_string_form():
    k = key_for()
    s = str(k)
    # No opgen or NVRTC version: records serve every compiler that builds the same source.
    assert s == f"w4a16_test|{SPEC.content_hash()}|sm_90|NVIDIA H200|N1024|K2048"
    assert DBKey.parse(s) == k and DBKey.parse(s).definition is None and k.definition is SPEC
    # The old form (opgen and NVRTC versions in it) still parses, for show and prune.
    old = f"w4a16_test|{SPEC.content_hash()}|sm_90|NVIDIA H200|0.1.0|nvrtc13.0|N1024|K2048"
    assert DBKey.parse(old) == k
    for bad in ("not|a|key", "a|b|c|d|N1|Kx", "a|b|c|d|0.1|nvrtc1|N1", "a|b|c|d|N0|K8", "a|b|c|d|N8|K-8"):
        with pytest.raises(ValueError):
            DBKey.parse(bad)
    assert "|" not in make_key(SPEC, 1, 1, arch="sm_90", device="odd|name").device


# --- records are checked against the code they were measured on -----------------------

def test_a_record_is_served_only_while_its_config_renders_the_same(path, tmp_path, monkeypatch):
    """A record whose config no longer renders to the source it was measured
    on (a template or planner change), one without a source hash (the old
    format), and one whose config does not render at all are all skipped,
    with a warning, and never break the lookup."""
    key = key_for()
    good = rec(5.0, cfg=CFGS[0])
    other = dict(rec(6.0, cfg=CFGS[0]), source_hash=rec(cfg=CFGS[1])["source_hash"])
    no_hash = {f: v for f, v in rec(7.0, cfg=CFGS[0]).items() if f != "source_hash"}
    garbage = dict(rec(8.0), config={"family": "gemm", "BM": "sixteen"})
    unknown = dict(rec(9.0), config={"colour": "blue"})
    write_records(path, {str(key): {"1": good, "2-4": other, "5-8": no_hash, "9-16": garbage,
                                    "17-32": unknown}})
    db = TuningDB(path, shipped=False)
    assert db.lookup(key, "1")["median_us"] == 5.0
    for bucket in ("2-4", "5-8", "9-16", "17-32"):
        with pytest.warns(RuntimeWarning, match="skipping the record"):
            assert db.lookup(key, bucket) is None
    assert set(db.lookup_all(key)) == {"1"}
    assert len(db.records()) == 5                               # listed, not served
    statuses = {e.bucket: tdb.record_status(key, e.record) for e in db.records()}
    assert statuses == {"1": tdb.CURRENT, "2-4": tdb.SOURCE_CHANGED, "5-8": tdb.NO_SOURCE_HASH,
                        "9-16": tdb.BAD_CONFIG, "17-32": tdb.BAD_CONFIG}

    # A template change that alters the kernel retires the record.
    real = render.render
    monkeypatch.setattr(tdb, "_RENDERED", {})
    monkeypatch.setattr(render, "render", lambda *a, **k: (real(*a, **k)[0] + "int x;",
                                                           real(*a, **k)[1]))
    with pytest.warns(RuntimeWarning, match="no longer renders"):
        assert TuningDB(path, shipped=False).lookup(key, "1") is None
    # ... a comment or layout change does not.
    monkeypatch.setattr(tdb, "_RENDERED", {})
    monkeypatch.setattr(render, "render", lambda *a, **k: ("// new words\n" + real(*a, **k)[0],
                                                           real(*a, **k)[1]))
    assert TuningDB(path, shipped=False).lookup(key, "1")["median_us"] == 5.0


def test_a_key_string_of_a_spec_that_is_not_shipped_cannot_be_checked(path, monkeypatch):
    """Its record is not served (nothing to render it with), and that does
    not stick: the key make_key gives (carrying the spec) is served after."""
    TuningDB(path, shipped=False).put(key_for(), "1", rec())
    monkeypatch.setattr(tdb, "_RENDERED", {})
    db = TuningDB(path, shipped=False, quiet=True)
    assert db.lookup(str(key_for()), "1") is None
    assert db.lookup(key_for(), "1") is not None


def test_records_of_execution_specs_are_checked_as_the_shipped_specs_are(path):
    """The tuner keys a record by the spec its kernels run (w2a16_g128 moved
    into its execution layout: w2a16_g128_exec): its key string alone
    renders as a shipped spec's does, and a layout change (another content
    hash under that name) makes its records stale, for prune."""
    e = planner.execution_spec(as_spec("w2a16_g128"), ARCH)
    assert e.name == "w2a16_g128_exec"
    cfg = planner.heuristic(e, ARCH, 64, 1024, 2048)
    key = key_for(spec=e)
    r = make_record(cfg.to_dict(), 10.0, M=64, config_name=cfg.name, nvrtc="12.9",
                    source_hash=tdb.rendered_hash(key, cfg.to_dict()))
    assert tdb.record_status(str(key), r) == tdb.CURRENT
    old = str(key).replace(e.content_hash(), "0" * 16)
    assert tdb.record_status(old, r) == tdb.SPEC_CHANGED
    write_records(path, {old: {"33-64": r}, str(key): {"33-64": r}})
    assert TuningDB(path, shipped=False).prune(tdb.stale()) == 1


def test_a_record_the_planner_refuses_never_reaches_the_op(path, monkeypatch):
    """A record whose config no longer plans (hand-edited, or from another
    planner) is skipped at lookup, so the op takes the heuristic's pick
    instead of failing to build its kernel."""
    monkeypatch.setattr(tdb, "device_name", lambda: "NVIDIA H200")      # what make_key asks
    bad = dict(rec(cfg=CFGS[0]), config=dict(CFGS[0].to_dict(), BM=7))
    write_records(path, {str(key_for()): {"9-16": bad, "1": rec(M=1, cfg=CFGS[1])}})
    op = MatmulOp(SPEC, 1024, 2048, arch=ARCH, db=TuningDB(path, shipped=False))
    with pytest.warns(RuntimeWarning, match="skipping"):
        assert op.choose("9-16") == planner.heuristic(SPEC, ARCH, 16, 1024, 2048, sms=op.sms)
    assert op.sources["9-16"] == "heuristic"
    assert op.choose("1") == CFGS[1] and op.sources["1"] == "db"


def test_a_stale_user_record_falls_back_on_the_shipped_one(path, tmp_path):
    shipped = tmp_path / "shipped.json"
    TuningDB(shipped, shipped=False).put(key_for(), "1", rec(5.0, cfg=CFGS[1]))
    write_records(path, {str(key_for()): {"1": dict(rec(4.0, cfg=CFGS[0]), source_hash="0" * 20)}})
    db = TuningDB(path, shipped=shipped)
    with pytest.warns(RuntimeWarning, match="skipping"):
        assert db.lookup(key_for(), "1")["config_name"] == CFGS[1].name


def test_lookup_cost(path):
    """The check costs one render the first time a config is looked up in a
    process, then a dict hit: a warm lookup stays well under a millisecond."""
    db = TuningDB(path, shipped=False)
    cfg = planner.candidates(SPEC, ARCH, 64, 1024, 2048)[-1]
    db.put(key_for(), "33-64", rec(cfg=cfg))
    tdb._RENDERED.clear()
    t0 = time.perf_counter()
    assert db.lookup(key_for(), "33-64") is not None
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(200):
        db.lookup(key_for(), "33-64")                 # make_key included, as the op does
    warm = (time.perf_counter() - t0) / 200
    assert warm < 1e-3 and first > warm


# --- shipped DBs ---------------------------------------------------------------------

def test_shipped_db_is_consulted_after_the_user_file(tmp_path, path):
    shipped = tmp_path / "shipped.json"
    TuningDB(shipped, shipped=False).put_many(
        [(key_for(), "1", rec(5.0, cfg=CFGS[0])), (key_for(), "2-4", rec(6.0, cfg=CFGS[1]))])
    db = TuningDB(path, shipped=shipped)
    assert db.lookup(key_for(), "1")["median_us"] == 5.0
    db.put(key_for(), "1", rec(4.0, cfg=CFGS[2]))
    assert db.lookup(key_for(), "1")["median_us"] == 4.0                # user wins
    assert db.lookup(key_for(), "2-4")["median_us"] == 6.0
    assert {b: r["median_us"] for b, r in db.lookup_all(key_for()).items()} == {"1": 4.0,
                                                                                "2-4": 6.0}
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
    shipped_spec = as_spec("w4a16_sym_g128")
    db = TuningDB(path, shipped=False)
    db.put_many([(key_for(), "1", rec()), (key_for(), "2-4", rec()),
                 (key_for(spec=shipped_spec), "1", rec(spec=shipped_spec))])
    db.put(key_for(N=1), "1", rec())
    old_key = str(key_for()).replace("|N1024", "|0.1.0|nvrtc13.0|N1024")
    old = {f: v for f, v in rec().items() if f != "source_hash"}
    doc = json.loads(path.read_text())
    doc["records"][old_key] = {"1": old}                  # the old key form: no source hash
    doc["records"][str(key_for(spec=shipped_spec, N=2))] = {
        "1": dict(rec(spec=shipped_spec), source_hash="0" * 20)}    # measured on other code
    path.write_text(json.dumps(doc))
    assert db.prune(tdb.stale()) == 2                     # the old record, the changed source
    # A shipped spec whose content changed since: every record of the old content goes.
    assert db.prune(tdb.stale({"w4a16_sym_g128": "0000"})) == 1
    # Records of a spec that is not shipped cannot be rendered here: kept.
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
    TuningDB(folder / "nvidia_h200.json", shipped=False).put(key_for(), "1", rec(5.0))
    h100 = key_for(device="NVIDIA H100 80GB HBM3")
    TuningDB(folder / "nvidia_h100_80gb_hbm3.json", shipped=False).put(h100, "1", rec(7.0))
    monkeypatch.setattr(tdb, "shipped_dir", lambda: folder)
    db = TuningDB(path)
    assert db.lookup(key_for(), "1")["median_us"] == 5.0
    assert db.lookup(h100, "1")["median_us"] == 7.0
    assert db.lookup(key_for(device="NVIDIA A100"), "1") is None        # nothing shipped for it
    assert db.lookup("not a key", "1") is None
    assert len(db.records("shipped")) == 2


def test_the_h200_db_ships_and_every_record_is_served(tmp_path):
    """The package's DB for the device the shipped kernels were tuned on:
    records of that device only, each with the source hash its config still
    renders to, so every install (any NVRTC: [cuda12] or [cuda13]) on an
    H200 gets all of them."""
    p = tdb.shipped_path(tdb.REFERENCE_DEVICE)
    assert p is not None and p.name == "nvidia_h200.json" and p in tdb.shipped_paths()
    db = TuningDB(p, shipped=False, quiet=True)
    assert not db.problems()
    entries = db.records()
    assert len(entries) > 500
    assert {DBKey.parse(e.key).device for e in entries} == {tdb.REFERENCE_DEVICE}
    status = {(e.key, e.bucket): tdb.record_status(e.key, e.record) for e in entries}
    assert [k for k, s in status.items() if s != tdb.CURRENT] == []
    # What an install on an H200 asks (make_key: no compiler version in it) hits.
    e = entries[0]
    k = DBKey.parse(e.key)
    key = make_key(as_spec(k.spec), k.N, k.K, arch=k.arch, device=tdb.REFERENCE_DEVICE)
    assert TuningDB(tmp_path / "none.json").lookup(key, e.bucket) == e.record


@pytest.mark.parametrize("p", tdb.shipped_paths(), ids=lambda p: p.name)
def test_every_shipped_record_is_current(p):
    """Every shipped DB (the H200's above; the H100's beside it): no record
    that a spec, layout or kernel change left behind."""
    entries = TuningDB(p, shipped=False, quiet=True).records()
    assert entries
    assert [(e.key, e.bucket) for e in entries if tdb.record_status(e.key, e.record) != tdb.CURRENT] == []


def test_put_refuses_a_key_no_lookup_could_name(path):
    """(the reader drops such records as bad: writing one would lose it)"""
    db = TuningDB(path, shipped=False)
    with pytest.raises(ValueError, match="not a tuning DB key"):
        db.put("my-key", "1", rec())
    with pytest.raises(ValueError, match="'heuristic_us' is -1.0"):
        db.put(key_for(), "1", dict(rec(), heuristic_us=-1.0))
    assert not path.exists()
