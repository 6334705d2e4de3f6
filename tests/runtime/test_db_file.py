"""One tuning DB file on disk (runtime/db_file.py), driven through TuningDB:
concurrent writers and lock-free readers, bad records, damaged and foreign
files, temp files of killed writers, paths the filesystem refuses, the
cached read."""
import dataclasses
import fcntl
import json
import multiprocessing
import os
import signal
import threading
import warnings

import pytest

from opgen.codegen import planner
from opgen.codegen.buckets import LABELS
from opgen.codegen.resolve import as_spec
from opgen.runtime import db_file
from opgen.runtime import tuning_db as tdb
from opgen.runtime.tuning_db import TuningDB, TuningDBError, make_key, make_record

SPEC = dataclasses.replace(as_spec("w4a16_sym_g128"), name="w4a16_test")
CFG = planner.heuristic(SPEC, "sm_90", 16, 1024, 2048)


def key_for(spec=SPEC, N=1024, K=2048, device="NVIDIA H200"):
    return make_key(spec, N, K, arch="sm_90", device=device)


SOURCE_HASH = tdb.rendered_hash(key_for(), CFG.to_dict())


def rec(us=10.0, M=16):
    return make_record(CFG.to_dict(), us, M=M, runner_up_us=[us * 1.1], heuristic_us=us * 1.3,
                       config_name=CFG.name, source_hash=SOURCE_HASH)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "sub" / "tuning.json"


def _writer(path, tag, n, barrier):
    db = TuningDB(path, shipped=False)
    barrier.wait()
    for i in range(n):
        db.put(key_for(N=64 * (i + 1), device=f"GPU {tag}"), LABELS[i % len(LABELS)], rec(float(i + 1)))


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


def test_records_not_an_object_is_corrupt(path):
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "opgen-tuning-db", "version": 1, "records": []}))
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert TuningDB(path, shipped=False).lookup(key_for(), "1") is None


def test_bad_records_are_skipped_one_by_one(path):
    """One bad record costs that record only: the others are served, and the
    next write keeps them all (the file as it was is copied aside)."""
    good = {str(key_for(N=64 * i)): {"1": rec(float(i))} for i in range(1, 21)}
    bad = {str(key_for(N=8)): {"1": {"median_us": 1.0},               # no config
                               "3": rec(),                             # no such bucket
                               "2-4": dict(rec(), median_us="fast"),
                               "5-8": dict(rec(), median_us=float("nan")),
                               "9-16": dict(rec(), median_us=10 ** 400),   # too large for a float
                               "17-32": dict(rec(), heuristic_us=-1.0)},
           str(key_for(N=16)): ["not", "an", "object"],
           "not|a|key": {"1": rec()}}                                  # never looked up
    path.parent.mkdir(parents=True)
    doc = {"format": "opgen-tuning-db", "version": 1, "records": {**good, **bad}}
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    db = TuningDB(path, shipped=False)
    with pytest.warns(RuntimeWarning, match=r"8 bad record\(s\) skipped"):
        assert db.lookup(key_for(N=64), "1")["median_us"] == 1.0
    assert len(db.records()) == 20 and db.lookup(key_for(N=8), "1") is None
    problems = db.problems()
    assert len(problems) == 8 and all(str(path) in p and p.endswith("skipped") for p in problems)

    with pytest.warns(RuntimeWarning, match=r"kept the 20 good one\(s\)"):
        db.put(key_for(N=4096), "1", rec(99.0))
    again = TuningDB(path, shipped=False, quiet=True)
    assert len(again.records()) == 21 and not again.problems()
    backups = list(path.parent.glob("tuning.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == before


@pytest.mark.parametrize("doc", [
    {"format": "opgen-tuning-db", "version": 2, "records": {}},
    {"format": "opgen-tuning-db", "version": True, "records": {}},     # (True == 1 in Python)
    {"format": "opgen-tuning-db", "version": 1.0, "records": {}},
    {"format": "something-else", "version": 1},
    {"unrelated": "settings"},
    [],
    [1, 2],
    "text",
    3,
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
    with pytest.raises(TuningDBError):
        TuningDB(path.parent / "other.json", shipped=False).export(path)
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.corrupt-*"))


def _killed_writer(path):
    """Put a record and die (SIGKILL) between the temp file and the replace."""
    os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
    TuningDB(path, shipped=False).put(key_for(N=8), "1", rec())


def test_temp_files_of_killed_writers_are_removed(path):
    """kill -9 between the temp file and the replace leaves the temp file;
    the next writer removes it under the lock (and only temp files of PATH)."""
    db = TuningDB(path, shipped=False)
    db.put(key_for(), "1", rec())
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        p = ctx.Process(target=_killed_writer, args=(path,))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        # each killed writer removed the one before it left: one at a time
        assert len(list(path.parent.glob("tuning.json.*.tmp"))) == 1
    orphans = list(path.parent.glob("tuning.json.*.tmp")) + [
        path.parent / "tuning.json.ab_12xyz.tmp", path.parent / "tuning.json.00000000.tmp"]
    others = [path.parent / "tuning.json.notes.tmp", path.parent / "other.json.abcd1234.tmp",
              path.parent / "tuning.json.corrupt-20260101T000000.000000"]
    for p in orphans[1:] + others:
        p.write_text("left behind")
    assert len(TuningDB(path, shipped=False).records()) == 1      # the killed puts: nothing
    db.put(key_for(), "2-4", rec())                               # the next write cleans up
    assert not any(p.exists() for p in orphans)
    assert all(p.exists() for p in others)
    assert len(db.records()) == 2


def test_filesystem_errors_are_one_line_naming_the_path(tmp_path):
    """A path that is a directory, or under a file: reads warn and fall back,
    writes raise TuningDBError (never a raw OSError), in one line."""
    folder = tmp_path / "a_dir.json"
    folder.mkdir()
    under_file = tmp_path / "a_file" / "tuning.json"
    under_file.parent.write_text("x")
    for p, why in ((folder, "Is a directory"), (under_file, "is not a directory")):
        db = TuningDB(p, shipped=False)
        with pytest.warns(RuntimeWarning, match="cannot be read"):
            assert db.lookup(key_for(), "1") is None
        for write in (lambda: db.put(key_for(), "1", rec()), lambda: db.prune(lambda *a: True),
                      lambda: TuningDB(tmp_path / "none.json", shipped=False).export(p)):
            with pytest.raises(TuningDBError, match=why) as e:
                write()
            assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_check_writable_makes_nothing(tmp_path):
    """The check before a tune: a DB whose folders are not there yet passes
    and nothing is made (the first write makes them); under a file it fails."""
    deep = tmp_path / "a" / "b" / "tuning.json"
    TuningDB(deep, shipped=False).check_writable()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(TuningDBError, match=r"f is not a directory"):
        TuningDB(tmp_path / "f" / "c" / "tuning.json", shipped=False).check_writable()
    TuningDB(deep, shipped=False).put(key_for(), "1", rec())        # where it exists: the lock's check
    TuningDB(deep, shipped=False).check_writable()
    deep.write_text("[1]")
    with pytest.raises(TuningDBError, match="refusing to write"):
        TuningDB(deep, shipped=False).check_writable()
    with pytest.raises(TuningDBError, match="cannot write the tuning DB .*too long"):
        TuningDB(tmp_path / ("x" * 300) / "tuning.json", shipped=False).check_writable()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_paths(tmp_path):
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    ro_file = tmp_path / "rw" / "tuning.json"
    TuningDB(ro_file, shipped=False).put(key_for(), "1", rec())
    ro_file.chmod(0o444)
    ro_dir.chmod(0o555)
    try:
        for p in (ro_dir / "tuning.json", ro_file):
            with pytest.raises(TuningDBError, match=r"cannot write the tuning DB .*(denied|read-only)"):
                TuningDB(p, shipped=False).put(key_for(), "2-4", rec())
        assert TuningDB(ro_file, shipped=False).lookup(key_for(), "1") is not None
    finally:
        ro_dir.chmod(0o755)


def test_a_read_only_file_is_refused_and_kept(path, monkeypatch):
    """The writer's read-only check (os.access) as CI meets it: root, which
    ignores the mode test_read_only_paths sets, so here os.access says no.
    The file is left as it was."""
    TuningDB(path, shipped=False).put(key_for(), "1", rec())
    before = path.read_bytes()
    real_access = os.access

    def deny_write(p, mode, *a, **k):
        if os.path.realpath(p) == os.path.realpath(path) and mode & os.W_OK:
            return False
        return real_access(p, mode, *a, **k)
    monkeypatch.setattr(os, "access", deny_write)
    with pytest.raises(TuningDBError, match=r"cannot write the tuning DB .*: it is read-only$"):
        TuningDB(path, shipped=False).put(key_for(), "2-4", rec())
    assert path.read_bytes() == before
    assert TuningDB(path, shipped=False).lookup(key_for(), "1") is not None


def test_permission_denied_is_one_line(path, monkeypatch):
    """What a read-only folder does to a writer (simulated: root, which runs
    these tests in CI, ignores permissions)."""
    real_open = os.open

    def deny_lock(p, *a, **k):
        if str(p).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(p, *a, **k)
    monkeypatch.setattr(os, "open", deny_lock)
    with pytest.raises(TuningDBError) as e:
        TuningDB(path, shipped=False).put(key_for(), "1", rec())
    assert str(e.value) == (f"cannot write the tuning DB {path}: Permission denied "
                            f"({path}.lock)")


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


def test_a_symlinked_db_is_written_through_its_link(tmp_path):
    """A DB path that is a symbolic link (a user's DB pointing at a shared
    one): the target is locked and replaced, the link stays a link."""
    shared = tmp_path / "shared" / "tuning.json"
    TuningDB(shared, shipped=False).put(key_for(N=64), "1", rec())
    link = tmp_path / "home" / "tuning.json"
    link.parent.mkdir()
    link.symlink_to(shared)
    TuningDB(link, shipped=False).put(key_for(N=128), "1", rec())
    assert link.is_symlink() and len(TuningDB(shared, shipped=False).records()) == 2
    assert (shared.parent / "tuning.json.lock").exists() and not (link.parent / "tuning.json.lock").exists()


def test_a_held_lock_is_waited_for_and_said(path, capsys):
    """A writer finding the lock held says so on stderr, waits, then writes."""
    TuningDB(path, shipped=False).put(key_for(N=64), "1", rec())
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.3, os.close, [fd]).start()         # closing releases it
    TuningDB(path, shipped=False).put(key_for(N=128), "1", rec())
    assert "another opgen process is writing the tuning DB" in capsys.readouterr().err
    assert len(TuningDB(path, shipped=False).records()) == 2


def test_the_bucket_labels_belong_to_the_format_version():
    """Records under a label this opgen does not know are dropped as bad:
    a change of codegen.buckets.LABELS must bump db_file.VERSION (then
    update this pin)."""
    assert (db_file.VERSION, LABELS) == (1, ("1", "2-4", "5-8", "9-16", "17-32", "33-64", "65-128",
                                             "129-256", "257-512", "513-1024", ">1024"))


def test_a_device_or_fifo_is_never_read_nor_replaced(tmp_path):
    """A DB path that is no regular file (/dev/null to turn the DB off,
    /dev/zero, a FIFO): read as empty with a warning, never read (it may
    not end or block), and a write is refused before any lock file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (fifo, type(fifo)(os.devnull)):
        sig, state = db_file.read_state(p)
        assert state.kind == "foreign" and "not a regular file" in state.detail
        with pytest.warns(RuntimeWarning, match="not a regular file"):
            assert TuningDB(p, shipped=False).records() == []
    with pytest.raises(TuningDBError, match="not a regular file"):
        TuningDB(fifo, shipped=False).put(key_for(), "1", rec())
    assert sorted(os.listdir(tmp_path)) == ["fifo"] and fifo.is_fifo()


def test_json_nested_too_deep_is_corrupt_not_a_crash(path):
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100000 + "]" * 100000)
    assert db_file.read_state(path)[1].kind == "corrupt"
