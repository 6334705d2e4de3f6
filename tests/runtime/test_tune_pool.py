"""Tuning pairs over several workers (runtime/tune_pool.py), on the CPU:
local worker processes on two fake GPUs (tune_pool_fakes.FakeTuner: the
real tune_task and tune_many with a fake timer, compiler and device), a
worker killed mid-run, a resumed run, --force, two devices' records in one
DB.  The Ray backend is tested in test_tune_ray.py."""
import io
import json

import pytest

from opgen.runtime import tune_pool, tuner, tuning_db
from opgen.runtime.progress import Progress
from opgen.runtime.tune_pool import LocalWorkers, Task, plan_tasks, tune_pairs
from opgen.runtime.tuning_db import TuningDB

from compile_fakes import FakeConfig, fake_spec
from tune_pool_fakes import DIE, FakeTuner, InProcess

A, B = "Fake GPU A", "Fake GPU B"
PAIRS = [(fake_spec("w4_fake"), 1024, 1024), (fake_spec("w4_fake"), 2048, 1024),
         (fake_spec("w5_fake"), 1024, 1024), (fake_spec("w5_fake"), 4096, 1024)]
MS = [1, 16]
BUCKETS = {"1", "9-16"}


@pytest.fixture(autouse=True)
def fake_hash(monkeypatch):
    # the driver's resume check renders records' configs and lists the
    # candidates they were tuned among: as the workers' fakes do
    monkeypatch.setattr(tuning_db, "rendered_hash", lambda key, config: f"src-{config['name']}")
    monkeypatch.setattr(tuner, "_candidates", lambda spec, arch, M, N, K: [FakeConfig("a"), FakeConfig("b")])


def stored(path):
    """{(spec, N, K, device): {bucket: winning config}} of a DB file."""
    out = {}
    for e in TuningDB(path, shipped=False).records():
        k = tuning_db.DBKey.parse(e.key)
        out.setdefault((k.spec, k.N, k.K, k.device), {})[e.bucket] = e.record["config_name"]
    return out


def local(pairs, db, *, force=False, devices=(("0", A), ("1", B)), child=False):
    gpus = [g for g, _ in devices]
    return tune_pairs(pairs, LocalWorkers(gpus, FakeTuner(devices=devices, child=child)), Ms=MS,
                      db=db, force=force, progress=False, workers=1)


def test_two_gpus_each_pair_stored_under_its_device(tmp_path):
    db = tmp_path / "db.json"
    run = local(PAIRS, db)
    assert [o.task.name() for o in run.outcomes] == ["w4_fake 1024x1024", "w4_fake 2048x1024",
                                                     "w5_fake 1024x1024", "w5_fake 4096x1024"]
    assert all(o.results.ok() and set(o.results) == BUCKETS for o in run.outcomes)
    # each GPU took a pair at once, and its records are keyed by its own device,
    # with its own winner ("a" on A, "b" on B)
    assert {o.worker: o.device for o in run.outcomes} == {"gpu0": A, "gpu1": B}
    expect = {(o.task.spec.name, o.task.N, o.task.K, o.device):
              dict.fromkeys(BUCKETS, "a" if o.device == A else "b") for o in run.outcomes}
    assert stored(db) == expect
    tally = {t.device: t for t in run.devices()}
    assert set(tally) == {A, B} and sum(t.tuned for t in tally.values()) == 4
    assert sum(t.records for t in tally.values()) == 8 and tally[A].workers == {"gpu0"}
    report = run.tune_run()
    assert len(report.results) == 4 and not report.interrupted


def test_a_dead_worker_loses_only_its_pair(tmp_path):
    db = tmp_path / "db.json"
    pairs = [PAIRS[0], (fake_spec(DIE), 1024, 1024), *PAIRS[1:]]
    run = local(pairs, db)
    dead = run.outcomes[1]
    assert dead.failed and "died (killed by SIGKILL) while tuning it" in dead.results.error
    # gpu1 died on its first pair: before it said what GPU it is
    assert (dead.worker, dead.device) == ("gpu1", "")
    rest = [o for o in run.outcomes if o is not dead]
    assert all(o.results.ok() for o in rest)
    # every other pair stored (by gpu0, or by gpu1's fresh worker: which
    # one takes the rest depends on how fast the new process starts)
    assert {(s, N, K) for s, N, K, _ in stored(db)} == {(s.name, N, K) for s, N, K in PAIRS}
    assert {o.worker for o in rest} <= {"gpu0", "gpu1"}
    assert [(t.device, t.failed, t.workers) for t in run.devices() if t.failed] == [
        ("(unknown)", 1, {"gpu1"})]
    assert run.tune_run().results[1].error == dead.results.error      # the report's row


def test_rerun_resumes_and_force_redoes(tmp_path, monkeypatch):
    db = tmp_path / "db.json"
    first = local(PAIRS, db, devices=(("0", A), ("1", A)), child=True)   # as compiles would
    assert all(o.results.ok() for o in first.outcomes)
    before = json.loads(db.read_text())
    # started again: every pair is in the DB for A: each worker skips it
    again = local(PAIRS, db, devices=(("0", A), ("1", A)))
    assert all(o.skipped for o in again.outcomes) and again.tune_run().results == []
    assert [t.skipped for t in again.devices()] == [4]
    assert json.loads(db.read_text()) == before
    # a pair with a bucket missing (a run stopped before storing it) is tuned again
    TuningDB(db, shipped=False).prune(lambda k, b, r: "N2048" in k and b == "9-16")
    part = tune_pairs(PAIRS, InProcess(A, monkeypatch), Ms=MS, db=db, progress=False, workers=1)
    assert [o.skipped for o in part.outcomes] == [True, False, True, True]
    assert set(part.outcomes[1].results) == BUCKETS
    # --force: all again, and a bucket subset (M=1 only) counts as done
    forced = tune_pairs(PAIRS, InProcess(A, monkeypatch), Ms=MS, db=db, progress=False,
                        workers=1, force=True)
    assert not any(o.skipped for o in forced.outcomes)
    assert all(t.done_on == {("sm_90", A)} for t in plan_tasks(PAIRS, [1], db))


def test_resume_is_per_device(tmp_path, monkeypatch):
    """Two devices' runs into one DB: each keeps its records under its own
    device, and a pair done on A is still tuned on B."""
    db = tmp_path / "db.json"
    tune_pairs(PAIRS[:2], InProcess(A, monkeypatch), Ms=MS, db=db, progress=False, workers=1)
    run = tune_pairs(PAIRS, InProcess(B, monkeypatch), Ms=MS, db=db, progress=False, workers=1)
    assert not any(o.skipped for o in run.outcomes)
    got = stored(db)
    assert len(got) == 6
    assert all(v == dict.fromkeys(BUCKETS, "a" if dev == A else "b")
               for (*_, dev), v in got.items())
    tasks = plan_tasks(PAIRS, MS, db)
    assert [t.done_on for t in tasks] == [{("sm_90", A), ("sm_90", B)}] * 2 + [{("sm_90", B)}] * 2
    assert plan_tasks(PAIRS, MS, db, force=True)[0].done_on == frozenset()


def test_progress_over_all_workers(tmp_path, monkeypatch):
    stream = io.StringIO()
    db = tmp_path / "db.json"
    tasks = [Task(i, s, N, K) for i, (s, N, K) in enumerate(PAIRS[:2])]
    board = tune_pool.Board(tasks, TuningDB(db, shipped=False), Progress(True, stream))
    InProcess(A, monkeypatch).run(tasks, {"Ms": MS, "workers": 1}, board)
    secs = [board.outcomes[i].seconds for i in (0, 1)]
    # not a terminal: one line per pair, none for the status line
    assert stream.getvalue().splitlines() == [
        f"1/2 [here {A}] w4_fake 1024x1024: stored 2 bucket(s) in {secs[0]:.1f} s",
        f"2/2 [here {A}] w4_fake 2048x1024: stored 2 bucket(s) in {secs[1]:.1f} s"]
    assert len(stored(db)) == 2                 # each stored as it came back


def test_workers_that_keep_dying_leave_the_rest_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_pool, "RESTARTS", 0)
    pairs = [(fake_spec(DIE), 1024 * i, 1024) for i in (1, 2)] + PAIRS[:1]
    run = tune_pairs(pairs, LocalWorkers(["0"], FakeTuner()), Ms=MS, db=tmp_path / "db.json",
                     progress=False, workers=1)
    assert "killed by SIGKILL" in run.outcomes[0].results.error
    assert [o.results.error for o in run.outcomes[1:]] == ["no worker left (each kept dying)"] * 2


def test_visible_gpus_without_a_gpu(monkeypatch):
    monkeypatch.setattr(tune_pool.device, "has_gpu", lambda: False)
    assert tune_pool.visible_gpus() == []
    monkeypatch.setattr(tune_pool.device, "has_gpu", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert tune_pool.visible_gpus() == ["2", "3"]
