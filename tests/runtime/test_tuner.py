"""The empirical tuner on the CPU: tune_many's control flow (many specs and
shapes, one compile pool, the rank and final passes, the DB writes) with
fakes for the planner, compiler and GPU bench; the real _Bench (tiled random
problem, poisoned output, row check) on a numpy "device"; `opgen tune`'s
command line.  The GPU tests are in test_tuner_gpu.py."""
import contextlib
import io
import json
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.runtime import tuner
from opgen.runtime.timing import Timing
from opgen.runtime.tuner import tolerance, tune, tune_many
from opgen.runtime.tuning_db import TuningDB

SPEC = Spec(name="w4a16_fake", op="matmul", a=Activation("float16"),
            b=Weight("uint4", scale=Scale("float16", "group", 128)), out=Output("float16"))
SPEC2 = Spec(name="w8a16_fake", op="matmul", a=Activation("float16"),
             b=Weight("int8", scale=Scale("float16", "channel")), out=Output("float16"))


# --- fakes -------------------------------------------------------------------------

@dataclass(frozen=True)
class FakeConfig:
    name: str

    def to_dict(self):
        return {"name": self.name}


C = {n: FakeConfig(n) for n in ("heur", "a", "b", "c", "d", "e", "f", "nocompile", "boom",
                                "nolaunch", "pd1", "pd2")}

# Candidates per M, the heuristic pick, and each config's device time in the
# rank pass and in the final pass (us at N = K = 1024; scaled with N * K).
CANDIDATES = {1: ["a", "b", "c", "d", "e", "f", "nocompile", "boom"], 64: ["a", "nolaunch", "c"]}
HEURISTIC = {1: "heur", 64: "a"}
RANK_US = {"heur": 10.0, "a": 5.0, "b": 4.0, "c": 6.0, "d": 20.0, "e": 5.5, "f": 5.2}
FULL_US = {"heur": 10.5, "a": 5.0, "b": 4.0, "c": 6.1, "d": 20.0, "e": 5.4, "f": 5.6}


class FakeBench:
    """Stands in for _Bench: fixed times, 'b' computes wrong results."""

    def __init__(self, spec, N, K, seed, *, rank_us=RANK_US, full_us=FULL_US, wrong=("b",),
                 fail_at=None):
        self.spec, self.N, self.K = spec, N, K
        self.scale = N * K / (1024 * 1024)
        self.rank_us, self.full_us, self.wrong, self.fail_at = rank_us, full_us, set(wrong), fail_at
        self.M = None
        self.ranked, self.timed, self.verified = {}, {}, {}      # M -> [(name, arg)]
        self.closed = False

    def select(self, M):
        self.M = M
        for d in (self.ranked, self.timed, self.verified):
            d[M] = []

    def rank(self, cfg, best_us=None, *, budget_ms, drop_ratio):
        if cfg.name == "nolaunch":
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
        if self.fail_at == (self.M, cfg.name):
            raise KeyboardInterrupt          # the run is killed here
        self.ranked[self.M].append((cfg.name, best_us))
        t = self.rank_us[cfg.name] * self.scale
        return Timing(t, [t], dropped=best_us is not None and t > drop_ratio * best_us)

    def time(self, cfg, *, estimate_us, budget_ms, repeats):
        self.timed[self.M].append((cfg.name, estimate_us))
        t = self.full_us[cfg.name] * self.scale
        return Timing(t, [t] * 5)

    def verify(self, cfg, tol):
        self.verified[self.M].append(cfg.name)
        if cfg.name in self.wrong:
            return False, 0.5, "relative error 5.0e-01 > 2.0e-03"
        return True, 1e-4, ""

    def close(self):
        self.closed = True


class FakeSession:
    made = []

    def __init__(self, arch, **bench_kw):
        self.arch, self.bench_kw = arch, bench_kw
        self.benches, self.forgotten, self.closed = [], [], False
        FakeSession.made.append(self)

    def bench(self, spec, N, K, seed):
        b = FakeBench(spec, N, K, seed, **self.bench_kw)
        self.benches.append(b)
        return b

    def forget(self, spec):
        self.forgotten.append(spec.name)

    def close(self):
        self.closed = True


def fake_compile(spec, cfg, arch):
    if cfg.name == "nocompile":
        return "CompileError: uses too much shared memory"
    if cfg.name == "boom":
        raise ValueError("template bug")
    return None


def fake_compile_many(jobs, workers):
    """Stands in for compiler.compile_many, in this process: (job, why) per job;
    like the real one run in-process, an unexpected error propagates."""
    for job in jobs:
        yield job, fake_compile(*job)


@pytest.fixture
def fakes(monkeypatch):
    FakeSession.made = []
    compiles = []

    def many(jobs, workers):
        compiles.append([(j[0].name, j[1].name) for j in jobs])
        return fake_compile_many(jobs, workers)
    monkeypatch.setattr(tuner, "_device_info", lambda arch: (arch or "sm_90", "Fake GPU", "12.9"))
    monkeypatch.setattr(tuner, "_candidates",
                        lambda spec, arch, M, N, K: [C[n] for n in CANDIDATES[M]])
    monkeypatch.setattr(tuner, "_heuristic", lambda spec, arch, M, N, K: C[HEURISTIC[M]])
    monkeypatch.setattr(tuner, "_stages", lambda spec, cfg: [(spec, cfg)])
    monkeypatch.setattr(tuner, "_compile_many", many)
    monkeypatch.setattr(tuner, "_make_session", FakeSession)
    return compiles


def only_session():
    assert len(FakeSession.made) == 1
    return FakeSession.made[0]


# --- one spec, one shape -------------------------------------------------------------

def test_two_pass_control_flow(fakes, tmp_path):
    db = TuningDB(tmp_path / "db.json", shipped=False)
    with pytest.warns(UserWarning, match="unexpected error"):
        res = tune(SPEC, 1024, 1024, Ms=[1, 64], db=db, workers=1, progress=False, finalists=2)

    assert set(res) == {"1", "33-64"} and res.ok()
    # Compile failures are dropped and counted (never timed).
    assert set(res.compile_failed) == {"nocompile", "boom"}
    b = only_session().benches[0]
    # Rank pass: every compiled candidate, the heuristic first and never
    # dropped, each against the best correct one so far.
    assert b.ranked[1] == [("heur", None), ("a", 10.0), ("b", 5.0), ("c", 5.0), ("d", 5.0),
                           ("e", 5.0), ("f", 5.0)]
    # Each new best is verified; b is fastest but wrong, so it is not the
    # yardstick (c-f are held to a's 5.0) and never a finalist.
    assert b.verified[1] == ["heur", "a", "b"]
    # Final pass: the heuristic's pick, then the 2 fastest of the rank pass
    # (d was dropped, b is wrong), each in full from its rank-pass estimate.
    assert b.timed[1] == [("heur", 10.0), ("a", 5.0), ("f", 5.2)]
    r1 = res["1"]
    assert r1["config"] == {"name": "a"} and r1["config_name"] == "a" and r1["M"] == 1
    assert r1["median_us"] == 5.0 and r1["heuristic_us"] == 10.5     # both from the final pass
    assert r1["runner_up_us"] == [5.6, 10.5]
    assert r1["rejected"] == ["b"] and [n for n, _ in res.verify_failed["1"]] == ["b"]
    assert r1["ranked"] == 7
    # M=64: the heuristic wins; a config that fails to launch is reported, not fatal.
    r64 = res["33-64"]
    assert r64["config"] == {"name": "a"} and r64["heuristic_us"] == 5.0 and r64["M"] == 64
    assert "nolaunch" in res.launch_failed
    assert b.closed and only_session().closed
    # Both records went to the DB under the key for this device.
    assert str(res.key) == f"w4a16_fake|{SPEC.content_hash()}|sm_90|Fake GPU|0.1.0|nvrtc12.9|N1024|K1024"
    again = TuningDB(tmp_path / "db.json", shipped=False)
    assert again.lookup(res.key, "1")["config"] == {"name": "a"}
    assert again.lookup(res.key, "33-64")["median_us"] == 5.0


@pytest.mark.filterwarnings("ignore:.*unexpected error")
def test_final_pass_decides(fakes, tmp_path, monkeypatch):
    """The rank pass's leaders need not win: the full-budget times decide, and
    the heuristic's pick wins when it is the fastest in full."""
    monkeypatch.setattr(tuner, "_make_session", lambda arch: FakeSession(
        arch, full_us=dict(FULL_US, a=7.0, b=7.0, f=6.5, heur=6.0), wrong=()))
    res = tune(SPEC, 1024, 1024, Ms=[1], db=TuningDB(tmp_path / "d.json", shipped=False),
               workers=1, progress=False, finalists=3)
    rec = res["1"]
    assert [n for n, _ in only_session().benches[0].timed[1]] == ["heur", "b", "a", "f"]
    assert rec["config_name"] == "heur" and rec["median_us"] == rec["heuristic_us"] == 6.0
    assert rec["runner_up_us"] == [6.5, 7.0, 7.0]


@settings(max_examples=60, deadline=None)
@given(rank=st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6),
       full=st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6),
       wrong=st.sets(st.sampled_from(["a", "b", "c", "d", "e"])),
       finalists=st.integers(1, 6))
def test_never_slower_than_the_heuristic(rank, full, wrong, finalists):
    """Whatever the times and whichever candidates are wrong, the heuristic's
    pick is timed in full and the stored winner is correct and at least as
    fast as it (in the same pass)."""
    names = ["heur", "a", "b", "c", "d", "e"]
    session = FakeSession("sm_90", rank_us=dict(zip(names, rank)), full_us=dict(zip(names, full)),
                          wrong=wrong)
    bench = session.bench(SPEC, 1024, 1024, 0)
    pair = tuner._Pair(SPEC, 1024, 1024, tuner.TuneResults("key"))
    plan = tuner._BucketPlan("1", 1, [C[n] for n in names[1:]], C["heur"])
    opts = tuner._Options(30.0, 1.0, finalists, 1.5, None, 0)
    compiled = {(SPEC, C[n]) for n in names}
    rec = tuner._tune_bucket(bench, pair, plan, compiled, tuner._Progress(False), opts, "1/1")
    assert [n for n, _ in bench.ranked[1]][0] == "heur" and bench.ranked[1][0][1] is None
    assert [n for n, _ in bench.timed[1]].count("heur") == 1
    assert rec["config_name"] not in wrong
    assert rec["median_us"] <= rec["heuristic_us"]
    assert len(bench.timed[1]) <= finalists + 1


def test_all_wrong_stores_nothing(fakes, tmp_path, monkeypatch):
    monkeypatch.setattr(tuner, "_make_session",
                        lambda arch: FakeSession(arch, wrong=set(RANK_US)))
    db = TuningDB(tmp_path / "db.json", shipped=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = tune(SPEC, 1024, 1024, Ms=[1], db=db, workers=1, progress=False)
    assert dict(res) == {} and "1" in res.untuned and not res.ok()
    assert any("no config stored" in str(x.message) for x in w)
    assert not (tmp_path / "db.json").exists()


def test_default_Ms_cover_every_bucket(fakes, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(tuner, "_candidates",
                        lambda spec, arch, M, N, K: seen.append(M) or [C["a"]])
    monkeypatch.setattr(tuner, "_heuristic", lambda spec, arch, M, N, K: C["a"])
    res = tune(SPEC, 256, 256, db=TuningDB(tmp_path / "d.json", shipped=False), workers=1,
               progress=False)
    assert seen == [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
    assert len(res) == 11


# --- many specs and shapes -------------------------------------------------------------

def test_many_specs_and_shapes(fakes, tmp_path, monkeypatch):
    """One compile pool for every kernel of the run (each once, though shared
    by shapes, buckets and specs' configs alike), one session, spec by spec;
    one DB update per (spec, shape), written as soon as the pair is done."""
    db = TuningDB(tmp_path / "db.json", shipped=False)
    writes = []
    real_put_many = db.put_many

    def put_many(items):
        items = list(items)
        writes.append({(str(k).split("|")[0], str(k).split("|")[-2]) for k, _, _ in items})
        real_put_many(items)
    monkeypatch.setattr(db, "put_many", put_many)

    shapes = [(1024, 1024), (2048, 1024)]
    with pytest.warns(UserWarning, match="unexpected error"):
        run = tune_many([SPEC, SPEC2], shapes, Ms=[1, 64], db=db, workers=1, progress=False)

    assert [(r.spec_name, r.N, r.K) for r in run.results] == [
        ("w4a16_fake", 1024, 1024), ("w4a16_fake", 2048, 1024),
        ("w8a16_fake", 1024, 1024), ("w8a16_fake", 2048, 1024)]
    # Compiled once, up front: each (spec, config) of the run exactly once.
    assert len(fakes) == 10 + 10         # workers=1: one job per call; 10 configs per spec
    jobs = [j for call in fakes for j in call]
    assert len(jobs) == len(set(jobs)) == run.kernels == 20 and run.kernels_failed == 4
    session = only_session()
    assert [(b.spec.name, b.N) for b in session.benches] == [
        ("w4a16_fake", 1024), ("w4a16_fake", 2048), ("w8a16_fake", 1024), ("w8a16_fake", 2048)]
    assert session.forgotten == ["w4a16_fake", "w8a16_fake"]      # after each spec's last shape
    assert writes == [{("w4a16_fake", "N1024")}, {("w4a16_fake", "N2048")},
                      {("w8a16_fake", "N1024")}, {("w8a16_fake", "N2048")}]
    # The times scale with the shape in the fake: each pair stored its own.
    recs = {(e.key.split("|")[0], e.key.split("|")[-2], e.bucket): e.record for e in db.records()}
    assert len(recs) == 8
    assert recs["w4a16_fake", "N2048", "1"]["median_us"] == 2 * recs["w4a16_fake", "N1024", "1"]["median_us"]
    assert all(r.ok() for r in run.results)
    assert run.total_s >= run.compile_s >= 0


@pytest.mark.filterwarnings("ignore:.*unexpected error")
def test_the_gpu_times_a_spec_while_the_next_ones_compile(fakes, tmp_path, monkeypatch):
    """workers > 1: one compile_many call with every kernel of the run, in the
    order the specs are timed; a spec is timed once its own kernels are done
    (here: SPEC while SPEC2's wait for SPEC to be timed)."""
    import threading
    spec1_timed = threading.Event()
    calls, yielded = [], []

    def many(jobs, workers):
        calls.append(([(s.name, c.name) for s, c, _ in jobs], workers))
        for job in jobs:
            if job[0] is SPEC2:
                assert spec1_timed.wait(10), "SPEC was not timed before SPEC2 compiled"
            yielded.append(job[0].name)
            yield job, fake_compile(*job) if job[1].name != "boom" else "ValueError: bug"
    monkeypatch.setattr(tuner, "_compile_many", many)

    class Session(FakeSession):
        def bench(self, spec, N, K, seed):
            # a spec is timed only once every kernel of it is done
            assert yielded.count(spec.name) == 10
            spec1_timed.set()
            return super().bench(spec, N, K, seed)
    monkeypatch.setattr(tuner, "_make_session", Session)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = tune_many([SPEC, SPEC2], [(1024, 1024)], Ms=[1, 64],
                        db=TuningDB(tmp_path / "db.json", shipped=False), workers=3,
                        progress=False)
    assert len(calls) == 1 and calls[0][1] == 3
    names = [s for s, _ in calls[0][0]]
    assert names == ["w4a16_fake"] * 10 + ["w8a16_fake"] * 10
    assert [r.ok() for r in run.results] == [True, True] and run.kernels == 20
    assert run.results[1].compile_failed["boom"] == "ValueError: bug"
    assert run.compile_s > 0


@pytest.mark.filterwarnings("ignore:.*unexpected error")
def test_an_interrupted_run_keeps_the_pairs_written(fakes, tmp_path, monkeypatch):
    """Interrupted (SIGINT) in a later run's first pair: the first run's
    records are in the DB, which is a valid file; the interrupted pair's
    finished bucket is not (one update per pair), and the run says so."""
    monkeypatch.setattr(tuner, "_make_session", lambda arch: FakeSession(arch, fail_at=(64, "c")))
    path = tmp_path / "db.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tune_many([SPEC], [(1024, 1024)], Ms=[1], db=TuningDB(path, shipped=False), workers=1,
                  progress=False)
    run = tune_many([SPEC2], [(1024, 1024), (2048, 1024)], Ms=[1, 64],
                    db=TuningDB(path, shipped=False), workers=1, progress=False)
    doc = json.loads(path.read_text())
    assert [k.split("|")[0] for k in doc["records"]] == ["w4a16_fake"]
    # It says so: the pair in progress and the one after are not stored.
    assert run.interrupted and FakeSession.made[-1].closed
    assert [r.error for r in run.results] == ["interrupted before it was stored"] * 2
    assert all(len(r) == 0 for r in run.results)


def test_a_failing_pair_does_not_stop_the_others(fakes, tmp_path, monkeypatch):
    from opgen.codegen.planner import PlanError

    def candidates(spec, arch, M, N, K):
        if N == 3000:
            raise PlanError(f"no kernel configuration fits {spec.name} at N={N}")
        return [C[n] for n in CANDIDATES[M]]
    monkeypatch.setattr(tuner, "_candidates", candidates)

    class Session(FakeSession):
        def bench(self, spec, N, K, seed):
            if spec is SPEC2:
                raise RuntimeError("out of memory")
            return super().bench(spec, N, K, seed)
    monkeypatch.setattr(tuner, "_make_session", Session)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = tune_many([SPEC, SPEC2], [(1024, 1024), (3000, 1024)], Ms=[1],
                        db=TuningDB(tmp_path / "db.json", shipped=False), workers=1, progress=False)
    by = {(r.spec_name, r.N): r for r in run.results}
    assert by["w4a16_fake", 1024].ok() and set(by["w4a16_fake", 1024]) == {"1"}
    assert by["w4a16_fake", 3000].error.startswith("PlanError: no kernel configuration")
    assert by["w8a16_fake", 1024].error == "setup failed: RuntimeError: out of memory"
    assert by["w8a16_fake", 3000].error.startswith("PlanError")
    text = tuner.report(run, tmp_path / "db.json")
    assert "== w8a16_fake  N=1024 K=1024: NOT tuned (setup failed: RuntimeError: out of memory)" in text
    assert "stored 1 record(s) of 1 bucket(s), 4 (spec, shape) pair(s)" in text


def test_configs_compile_as_their_launch_stages(fakes, tmp_path, monkeypatch):
    """A predecode config is two kernels: the dequant stage (shared by every
    predecode config of the spec: compiled once) and its dense GEMM; it is
    timed only if both compiled."""
    dq, bad = FakeConfig("dequant"), FakeConfig("nocompile")
    stages = {"pd1": [dq, FakeConfig("gemm1")], "pd2": [dq, bad]}
    monkeypatch.setattr(tuner, "_stages",
                        lambda spec, cfg: [(spec, c) for c in stages.get(cfg.name, [cfg])])
    monkeypatch.setattr(tuner, "_candidates", lambda spec, arch, M, N, K: [C["pd1"], C["pd2"]])
    monkeypatch.setattr(tuner, "_heuristic", lambda spec, arch, M, N, K: C["a"])
    monkeypatch.setattr(tuner, "_make_session",
                        lambda arch: FakeSession(arch, rank_us={"a": 3.0, "pd1": 2.0},
                                                 full_us={"a": 3.0, "pd1": 2.0}))
    run = tune_many([SPEC], [(1024, 1024)], Ms=[4096], db=TuningDB(tmp_path / "d.json",
                    shipped=False), workers=1, progress=False)
    assert sorted(n for call in fakes for _, n in call) == ["a", "dequant", "gemm1", "nocompile"]
    res = run.results[0]
    assert res.compile_failed == {"pd2": "CompileError: uses too much shared memory"}
    assert [n for n, _ in only_session().benches[0].ranked[4096]] == ["a", "pd1"]
    assert res[">1024"]["config_name"] == "pd1"


def test_report_and_progress_lines(fakes, tmp_path):
    pipe = io.StringIO()
    with contextlib.redirect_stderr(pipe), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = tune_many([SPEC], [(1024, 1024)], Ms=[1, 64],
                        db=TuningDB(tmp_path / "db.json", shipped=False), workers=1)
    log = pipe.getvalue().splitlines()
    assert "tune 1/1 w4a16_fake 1024x1024 [1 M=1] 7 ranked, 5 in full: 5.00 us (a), " \
           "heuristic 10.50 us" in log
    assert any(line.startswith("1/1 w4a16_fake 1024x1024: stored 2 of 2 bucket(s) in ")
               for line in log)
    text = tuner.report(run, tmp_path / "db.json")
    lines = text.splitlines()
    assert lines[0].startswith("== w4a16_fake  N=1024 K=1024  (")
    assert lines[1].split() == ["bucket", "M", "best", "config", "us", "heuristic", "us", "speedup"]
    assert lines[3].split() == ["1", "1", "a", "5.00", "10.50", "2.10"]
    assert lines[4].split() == ["33-64", "64", "a", "5.00", "5.00", "1.00"]
    assert "1 config(s) failed to launch: nolaunch: RuntimeError: CUDA_ERROR_INVALID_VALUE" in text
    assert lines[-1].startswith("total ") and "compiling 10 kernels" in lines[-1]


# --- compiling -------------------------------------------------------------------------

def test_compile_all_sequential_drops_a_crashing_config(monkeypatch):
    """workers=1: one job at a time, so an unexpected exception (a compiler
    bug) drops that config only, not the ones after it."""
    calls = []

    def many(jobs, workers):
        calls.append(([j[1].name for j in jobs], workers))
        return fake_compile_many(jobs, workers)
    monkeypatch.setattr(tuner, "_compile_many", many)
    jobs = [(SPEC, C[n]) for n in ("a", "nocompile", "boom", "c")]
    status = {}
    tuner._compile_all(jobs, "sm_90", 1, status.__setitem__)
    assert calls == [(["a"], 1), (["nocompile"], 1), (["boom"], 1), (["c"], 1)]
    assert status[SPEC, C["a"]] is None and status[SPEC, C["c"]] is None
    assert status[SPEC, C["nocompile"]].startswith("CompileError")
    assert status[SPEC, C["boom"]].startswith("ValueError: template bug")


def test_compile_all_parallel_goes_through_compile_many(monkeypatch):
    """workers > 1: every job in one compile_many call; results are taken in
    completion order (here reversed); stop() ends it early."""
    calls = []

    def many(jobs, workers):
        calls.append((list(jobs), workers))
        for job in reversed(jobs):
            yield job, ("CompileError: too big" if job[1].name == "nocompile" else None)
    monkeypatch.setattr(tuner, "_compile_many", many)
    jobs = [(SPEC, C[n]) for n in ("a", "nocompile", "c")] + [(SPEC2, C["a"])]
    status = {}
    tuner._compile_all(jobs, "sm_90", 4, status.__setitem__)
    assert calls == [([(s, c, "sm_90") for s, c in jobs], 4)]
    assert status == {(SPEC2, C["a"]): None, (SPEC, C["c"]): None,
                      (SPEC, C["nocompile"]): "CompileError: too big", (SPEC, C["a"]): None}
    status.clear()
    tuner._compile_all(jobs, "sm_90", 4, status.__setitem__, stop=lambda: len(status) == 2)
    assert len(status) == 2


def test_compiles_in_this_process_show_progress(monkeypatch):
    monkeypatch.setattr(tuner, "_compile_many", fake_compile_many)
    pipe = io.StringIO()
    stages = {(SPEC, C["a"]): [(SPEC, C["a"])], (SPEC, C["pd1"]): [(SPEC, C["c"]), (SPEC, C["nocompile"])]}
    compiles = tuner._Compiles(stages, "sm_90", 1, tuner._Progress(True, pipe))
    compiles.wait(SPEC)
    assert pipe.getvalue().splitlines()[0] == "compile [####################] 3/3  failed 1"
    assert pipe.getvalue().splitlines()[1].startswith("compiled 3 kernels in ")
    assert compiles.verdict(SPEC, C["a"]) is None
    assert compiles.verdict(SPEC, C["pd1"]).startswith("CompileError")


def test_compile_in_spawned_workers(monkeypatch, tmp_path):
    """The real compile_many in spawned workers (NVRTC needs no GPU): configs
    that compile land in the cubin cache, one the planner rejects is dropped
    with the reason."""
    pytest.importorskip("cupy")
    from opgen.codegen.planner import Config, heuristic
    from opgen.codegen.validate import load_spec, resolve_spec
    from opgen.codegen.compiler import cache_dir
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    spec = load_spec(resolve_spec("w4a16_sym_g128"))
    good = list(dict.fromkeys(heuristic(spec, "sm_90", M, 512, 512) for M in (1, 64)))
    bad = Config("gemm", BM=16, BN=128, BK=64, WM=16, WN=24)     # warp tile does not divide
    status = {}
    tuner._compile_all([(spec, c) for c in [*good, bad]], "sm_90", 2, status.__setitem__)
    assert all(status[spec, c] is None for c in good), status
    assert status[spec, bad].startswith("PlanError")
    assert len(list(cache_dir().glob("*.cubin"))) == len(good)


# --- the tiled problem and its check, on a numpy "device" ----------------------------------

class NumpyKernel:
    """A kernel stand-in computing the full reference of whatever (tiled)
    problem it is given, then spoiling it as asked."""

    def __init__(self, spec, fault=None):
        self.spec, self.fault = spec, fault

    def __call__(self, a, tensors, out, a_scale=None, bias=None, stream=None):
        from opgen.codegen import numerics as nx
        from opgen.codegen.reference import reference_matmul_f32
        ref = np.asarray(reference_matmul_f32(self.spec, a, tensors, a_scale=a_scale, bias=bias),
                         dtype=np.float32)
        if self.fault == "scale":            # 1.5x the tolerance: twice it would pass the bench
            ref = ref * (1 + 1.5 * tolerance(self.spec))
        if self.fault == "half_k":           # loses one of two split-K slices (exactly half
            ref = ref * 0.5                  # of the sum: the data repeat along K)
        out[...] = nx.to_storage(ref, self.spec.out.dtype)
        if self.fault == "last_tile":        # leaves the last 16 rows unwritten
            out[-16:] = tuner._poison(self.spec)


class NumpySession:
    """_Session's device interface on numpy: what _Bench needs, no GPU."""
    xp = np
    base_limit = 256
    l2 = 1 << 20
    stream = contextlib.nullcontext()

    def __init__(self, fault=None):
        self.fault, self.released = fault, 0

    def to_device(self, x):
        return np.ascontiguousarray(x)

    def to_host(self, x):
        return np.asarray(x)

    def free_bytes(self):
        return 1 << 34

    def synchronize(self):
        pass

    def release(self):
        self.released += 1

    def kernel(self, spec, cfg):
        return NumpyKernel(spec, self.fault if cfg == "faulty" else None)


def _spec(name):
    from opgen.codegen.validate import load_spec, resolve_spec
    return load_spec(resolve_spec(name))


@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "w8a8_int8", "fp8_e4m3_w8a8"])
def test_bench_tiles_the_problem_and_checks_rows(name):
    """The real _Bench on numpy: weights drawn at the base shape and tiled to
    the full one (stored layout: packed words, scale groups, zeros), the
    activation drawn at M0 rows and tiled; rotating copies over 2x "L2"; a
    correct kernel passes the row check with the tuner's own tolerance, and a
    wrong one fails it (or the poison shows what it left unwritten)."""
    from opgen.bench.roofline import stored_shapes
    spec = _spec(name)
    N, K, M = 512, 1024, 1024
    session = NumpySession(fault=None)
    bench = tuner._Bench(session, spec, N, K, seed=3)
    assert (bench.N0, bench.K0) == (256, 256)
    want = stored_shapes(spec, N, K)
    assert {k: v.shape for k, v in bench.w_sets[0].items()} == want
    # Random and never zero: the tiled weights repeat the base ones.
    assert np.any(bench.base.real != 0)
    bench.select(M)
    a, a_scale = bench.acts[0]
    assert bench.M0 == 512 and a.shape == (M, K)
    assert np.array_equal(a[:512, :256], a[512:, 256:512]) and np.any(a != 0)
    assert (a_scale is None) == (spec.a.scale != "row")
    # Rotating copies: all sets together over twice the "L2".
    n = len(bench.acts)
    per = (sum(w.nbytes for w in bench.w_sets[0].values()) + a.nbytes
           + (0 if a_scale is None else a_scale.nbytes) + bench.outs[0].nbytes)
    assert n == len(bench.outs) >= 2 and n * per >= 2 * session.l2 and len(bench.w_sets) >= n

    tol = tolerance(spec)
    ok, err, why = bench.verify("good", tol)
    assert ok and err < tol / 4, (err, why)
    for fault, msg in (("scale", "relative error"), ("half_k", "relative error"),
                       ("last_tile", "outputs NaN/Inf")):
        session.fault = fault
        ok, err, why = bench.verify("faulty", tol)
        assert not ok and msg in why, (fault, err, why)
    session.fault = None
    # Another bucket reuses the weight copies; close frees everything.
    n_w = len(bench.w_sets)
    bench.select(16)
    assert bench.acts[0][0].shape == (16, K) and len(bench.w_sets) >= n_w
    assert bench.verify("good", tol)[0]
    bench.close()
    assert bench.w_sets is None and session.released == 1


def test_base_data_are_shared_and_reproducible():
    spec = _spec("gptq_v2_w4a16_g128")
    w = tuner._base_weights(spec, 256, 256, 0)
    assert tuner._base_weights(spec, 256, 256, 0) is w          # every shape of the spec
    assert w.real.shape == (256, 256) and np.any(w.real != 0)
    a, s = tuner._base_activation(spec, 16, 256, 0)
    assert a.shape == (16, 256) and s is None
    assert not np.array_equal(a, tuner._base_activation(spec, 16, 256, 1)[0])


def test_nonfinite_counts_poison_in_every_out_dtype():
    for dtype, arr in (("float16", np.zeros(8, np.float16)), ("float32", np.zeros(8, np.float32)),
                       ("bfloat16", np.zeros(8, np.uint16))):
        spec = Spec(name="x", op="matmul", a=Activation("float16"), b=None, out=Output(dtype))
        arr[:3] = tuner._poison(spec)
        assert tuner._nonfinite(spec, arr, np) == 3
        assert np.isnan(tuner._out_to_f32(spec, arr[:3])).all()


# --- `opgen tune` ------------------------------------------------------------------------

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
    from opgen.cli import main
    monkeypatch.setattr(tuner, "tune_many", lambda *a, **k: pytest.fail("must not start"))
    try:
        rc = main(["tune", *argv])
    except SystemExit as e:               # argparse's usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_cli_resolves_specs_and_shapes(capsys, monkeypatch, tmp_path):
    from opgen.bench.plan import shipped_matmul_specs
    from opgen.cli import main
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


def test_tolerance():
    assert math.isclose(tolerance(SPEC), 2e-3, rel_tol=0.05)
    bf16 = Spec(name="x", op="matmul", a=Activation("bfloat16"), b=None, out=Output("bfloat16"))
    f32 = Spec(name="x", op="matmul", a=Activation("float16"), b=None, out=Output("float32"))
    assert 1e-2 <= tolerance(bf16) <= 2e-2
    assert 5e-4 <= tolerance(f32) <= 1.1e-3
    assert tolerance(f32) < tolerance(SPEC) < tolerance(bf16)


def test_progress_line():
    tty = io.StringIO()
    tty.isatty = lambda: True
    p = tuner._Progress(True, tty)
    p.show("compile [####] 4/4", milestone=True)
    p.show("tune x", milestone=True)
    p.end()
    assert tty.getvalue() == "\rcompile [####] 4/4\rtune x            \n"
    pipe = io.StringIO()
    p = tuner._Progress(True, pipe)
    p.show("not a milestone")
    p.show("done", milestone=True)
    assert pipe.getvalue() == "done\n"
    assert tuner._Progress.bar(1, 4, 8) == "[##------]"
