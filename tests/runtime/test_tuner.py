"""The empirical tuner (runtime/tuner.py). On the CPU: tune_many's control
flow (many specs and shapes, one compile pool, the rank and final passes,
the DB writes) with fakes for the planner, compiler and GPU workbench. On
the GPU (gpu mark): a real run end to end.  The workbench itself is tested
in test_workbench.py, the compile pool in test_compile_pool.py, `opgen tune`
in tests/package/test_cli_tune.py."""
import contextlib
import io
import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen.planner import Config, PlanError
from opgen.cli.tune import report          # the run's report, as `opgen tune` prints it
from opgen.codegen.resolve import as_spec
from opgen.codegen.tolerance import tolerance
from opgen.runtime import compile_pool, tuner, tuning_db, workbench
from opgen.runtime.device import current_arch
from opgen.runtime.kernel import Kernel
from opgen.runtime.progress import Progress
from opgen.runtime.timing import Timing
from opgen.runtime.tuner import tune, tune_many
from opgen.runtime.tuning_db import TuningDB

from compile_fakes import SPEC, SPEC2, FakeConfig, fake_compile, fake_compile_many



# --- fakes -------------------------------------------------------------------------



C = {n: FakeConfig(n) for n in ("heur", "a", "b", "c", "d", "e", "f", "nocompile", "boom",
                                "nolaunch", "pd1", "pd2")}

# Candidates per M, the heuristic pick, and each config's device time in the
# rank pass and in the final pass (us at N = K = 1024; scaled with N * K).
CANDIDATES = {1: ["a", "b", "c", "d", "e", "f", "nocompile", "boom"], 64: ["a", "nolaunch", "c"]}
HEURISTIC = {1: "heur", 64: "a"}
RANK_US = {"heur": 10.0, "a": 5.0, "b": 4.0, "c": 6.0, "d": 20.0, "e": 5.5, "f": 5.2}
FULL_US = {"heur": 10.5, "a": 5.0, "b": 4.0, "c": 6.1, "d": 20.0, "e": 5.4, "f": 5.6}


class FakeBench:
    """Stands in for workbench.Problem: fixed times, 'b' computes wrong results
    (FakeSession.kernel hands out the config itself as the kernel)."""

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

    def problem(self, spec, N, K, seed):
        b = FakeBench(spec, N, K, seed, **self.bench_kw)
        self.benches.append(b)
        return b

    def kernel(self, spec, cfg):
        return cfg

    def forget(self, spec):
        self.forgotten.append(spec.name)

    def close(self):
        self.closed = True


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
    monkeypatch.setattr(compile_pool, "compile_many", many)
    monkeypatch.setattr(tuner, "_make_session", FakeSession)
    # Fake configs do not render: their records' source hash is their name.
    monkeypatch.setattr(tuning_db, "rendered_hash", lambda key, config: f"src-{config['name']}")
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
    assert r1["heuristic_config"] == "heur"                          # what heuristic_us timed
    assert r1["runner_up_us"] == [5.6, 10.5]
    assert r1["rejected"] == ["b"] and [n for n, _ in res.verify_failed["1"]] == ["b"]
    assert r1["ranked"] == 7
    # M=64: the heuristic wins; a config that fails to launch is reported, not fatal.
    r64 = res["33-64"]
    assert r64["config"] == {"name": "a"} and r64["heuristic_us"] == 5.0 and r64["M"] == 64
    assert "nolaunch" in res.launch_failed
    assert b.closed and only_session().closed
    # Both records went to the DB under the key for this device.
    assert str(res.key) == f"w4a16_fake|{SPEC.content_hash()}|sm_90|Fake GPU|N1024|K1024"
    assert r1["source_hash"] == "src-a" and r1["nvrtc"] == "12.9"
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
    bench = session.problem(SPEC, 1024, 1024, 0)
    pair = tuner._Pair(SPEC, 1024, 1024, tuner.TuneResults("key"))
    plan = tuner._BucketPlan("1", 1, [C[n] for n in names[1:]], C["heur"])
    opts = tuner._Options(30.0, 1.0, finalists, 1.5, None, 0)
    compiled = {(SPEC, C[n]) for n in names}
    rec = tuner._tune_bucket(tuner._Trials(session, bench, SPEC), pair, plan, compiled,
                             Progress(False), opts, "1/1")
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
    spec1_timed = threading.Event()
    calls, yielded = [], []

    def many(jobs, workers):
        calls.append(([(s.name, c.name) for s, c, _ in jobs], workers))
        for job in jobs:
            if job[0] is SPEC2:
                assert spec1_timed.wait(10), "SPEC was not timed before SPEC2 compiled"
            yielded.append(job[0].name)
            yield job, fake_compile(*job) if job[1].name != "boom" else "ValueError: bug"
    monkeypatch.setattr(compile_pool, "compile_many", many)

    class Session(FakeSession):
        def problem(self, spec, N, K, seed):
            # a spec is timed only once every kernel of it is done
            assert yielded.count(spec.name) == 10
            spec1_timed.set()
            return super().problem(spec, N, K, seed)
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
    def candidates(spec, arch, M, N, K):
        if N == 3000:
            raise PlanError(f"no kernel configuration fits {spec.name} at N={N}")
        return [C[n] for n in CANDIDATES[M]]
    monkeypatch.setattr(tuner, "_candidates", candidates)

    class Session(FakeSession):
        def problem(self, spec, N, K, seed):
            if spec is SPEC2:
                raise RuntimeError("out of memory")
            return super().problem(spec, N, K, seed)
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
    text = report(run, tmp_path / "db.json")
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
    text = report(run, tmp_path / "db.json")
    lines = text.splitlines()
    assert lines[0].startswith("== w4a16_fake  N=1024 K=1024  (")
    assert lines[1].split() == ["bucket", "M", "best", "config", "us", "heuristic", "us", "speedup"]
    assert lines[3].split() == ["1", "1", "a", "5.00", "10.50", "2.10"]
    assert lines[4].split() == ["33-64", "64", "a", "5.00", "5.00", "1.00"]
    assert "1 config(s) failed to launch: nolaunch: RuntimeError: CUDA_ERROR_INVALID_VALUE" in text
    assert lines[-1].startswith("total ") and "compiling 10 kernels" in lines[-1]


# --- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu   # skipped without a GPU (tests/conftest.py)
def test_tune_end_to_end(tmp_path):
    """Two shapes in one run: 1024^2 (drawn at full size) and 4096^2 (drawn
    at 2048^2 and tiled on the GPU); the stored winners, rebuilt from the DB,
    match the full numpy reference on a fresh random problem, and are at
    least as fast as the heuristic's pick."""
    spec = as_spec("gptq_v2_w4a16_g128")
    db = TuningDB(tmp_path / "tuning.json", shipped=False)
    run = tune_many([spec], [(1024, 1024), (4096, 4096)], Ms=[1, 64], db=db, progress=False)
    for res in run.results:
        assert set(res) == {"1", "33-64"}, (res.untuned, res.verify_failed, res.error)

    again = TuningDB(tmp_path / "tuning.json", shipped=False)
    N = K = 1024
    res = run.results[0]
    for bucket, M in (("1", 1), ("33-64", 64)):
        rec = again.lookup(res.key, bucket)
        assert rec is not None and rec["M"] == M and rec["median_us"] > 0
        if rec["heuristic_us"] is not None and "heur" not in str(rec.get("rejected")):
            assert rec["median_us"] <= rec["heuristic_us"]
        # The stored winner, rebuilt from the DB, computes the right answer.
        kernel = Kernel(spec, Config.from_dict(rec["config"]), current_arch())
        err, finite = workbench.full_check(workbench.Session(current_arch()), spec, kernel, M, N, K,
                                           np.random.default_rng(123))
        assert finite and err <= tolerance(spec), (bucket, err)

    # A second process loads the tuned op from the DB: < 50 ms per kernel
    # (cubins from the cache the tuner filled; DB lookup + module load), and
    # < 50 ms per kernel counting opgen.load too. The costs every CUDA process
    # pays once (imports, the CUDA context, loading NVRTC to learn its version)
    # are measured separately (bench/load_time.py prints the same breakdown).
    script = Path(__file__).resolve().parents[2] / "bench" / "load_time.py"
    proc = subprocess.run([sys.executable, str(script), "gptq_v2_w4a16_g128", "--N", str(N),
                           "--K", str(K), "--M", "1,64", "--db", str(tmp_path / "tuning.json")],
                          capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["sources"] == {"1": "db", "33-64": "db"}, got
    ms = got["ms"]
    kernels = [ms["kernel_M1"], ms["kernel_M64"]]
    assert max(kernels) < 50, ms
    assert (ms["opgen_load"] + sum(kernels)) / len(kernels) < 50, ms
