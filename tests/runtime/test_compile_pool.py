"""The compile pool (runtime/compile_pool.py) on the CPU: in this process
one job at a time, through compile_many in worker processes, per-spec waits
and verdicts, and the real NVRTC in spawned workers (no GPU needed)."""
import io
import threading

import pytest

from opgen.codegen.compiler import cache_dir
from opgen.codegen.planner import Config, heuristic
from opgen.codegen.resolve import as_spec
from opgen.runtime import compile_pool
from opgen.runtime.progress import Progress

from compile_fakes import SPEC, SPEC2, FakeConfig, fake_compile_many





C = {n: FakeConfig(n) for n in ("a", "c", "nocompile", "boom", "pd1")}


def test_compile_all_sequential_drops_a_crashing_config(monkeypatch):
    """workers=1: one job at a time, so an unexpected exception (a compiler
    bug) drops that config only, not the ones after it."""
    calls = []

    def many(jobs, workers):
        calls.append(([j[1].name for j in jobs], workers))
        return fake_compile_many(jobs, workers)
    monkeypatch.setattr(compile_pool, "compile_many", many)
    jobs = [(SPEC, C[n]) for n in ("a", "nocompile", "boom", "c")]
    status = {}
    compile_pool.compile_all(jobs, "sm_90", 1, status.__setitem__)
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
    monkeypatch.setattr(compile_pool, "compile_many", many)
    jobs = [(SPEC, C[n]) for n in ("a", "nocompile", "c")] + [(SPEC2, C["a"])]
    status = {}
    compile_pool.compile_all(jobs, "sm_90", 4, status.__setitem__)
    assert calls == [([(s, c, "sm_90") for s, c in jobs], 4)]
    assert status == {(SPEC2, C["a"]): None, (SPEC, C["c"]): None,
                      (SPEC, C["nocompile"]): "CompileError: too big", (SPEC, C["a"]): None}
    status.clear()
    compile_pool.compile_all(jobs, "sm_90", 4, status.__setitem__, stop=lambda: len(status) == 2)
    assert len(status) == 2


def test_pdl_jobs_carry_their_flag_to_the_compiler(monkeypatch):
    """(spec, config, True): compile_many gets (spec, config, arch, True) and
    the job comes back as it was given, in and out of process; a Compiles
    keyed by it waits for it under its spec."""
    seen = []

    def many(jobs, workers):
        for job in jobs:
            seen.append(job)
            yield job, None
    monkeypatch.setattr(compile_pool, "compile_many", many)
    jobs = [(SPEC, C["a"]), (SPEC, C["a"], True)]
    for workers in (1, 4):
        status = {}
        compile_pool.compile_all(jobs, "sm_90", workers, status.__setitem__)
        assert status == {jobs[0]: None, jobs[1]: None}
    assert seen[-2:] == [(SPEC, C["a"], "sm_90"), (SPEC, C["a"], "sm_90", True)]
    c = compile_pool.Compiles({j: [j] for j in jobs}, "sm_90", 1)
    c.wait(SPEC)
    assert c.failed() == 0 and c.verdict(SPEC, C["a"]) is None


def test_compiles_in_this_process_show_progress(monkeypatch):
    monkeypatch.setattr(compile_pool, "compile_many", fake_compile_many)
    pipe = io.StringIO()
    stages = {(SPEC, C["a"]): [(SPEC, C["a"])], (SPEC, C["pd1"]): [(SPEC, C["c"]), (SPEC, C["nocompile"])]}
    compiles = compile_pool.Compiles(stages, "sm_90", 1, Progress(True, pipe))
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
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    spec = as_spec("w4a16_sym_g128")
    good = list(dict.fromkeys(heuristic(spec, "sm_90", M, 512, 512) for M in (1, 64)))
    bad = Config("gemm", BM=16, BN=128, BK=64, WM=16, WN=24)     # warp tile does not divide
    status = {}
    compile_pool.compile_all([(spec, c) for c in [*good, bad]], "sm_90", 2, status.__setitem__)
    assert all(status[spec, c] is None for c in good), status
    assert status[spec, bad].startswith("PlanError")
    assert len(list(cache_dir().glob("*.cubin"))) == len(good)


def test_wait_all_and_close_in_the_background(monkeypatch):
    """workers > 1: a thread drains compile_many; wait_all blocks until every
    job is reported (a pool that breaks fails the rest); close stops after
    the job in flight and closes compile_many."""
    release, closed = threading.Event(), []

    def many(jobs, workers, fail_after=None):
        try:
            for k, job in enumerate(jobs):
                assert release.wait(10)
                if k == fail_after:
                    raise RuntimeError("pool broke")
                yield job, ("CompileError: x" if job[1].name == "nocompile" else None)
        finally:
            closed.append(True)

    jobs = {(SPEC, C[n]): [(SPEC, C[n])] for n in ("a", "c", "nocompile", "pd1")}
    monkeypatch.setattr(compile_pool, "compile_many", many)
    release.set()
    compiles = compile_pool.Compiles(jobs, "sm_90", 3)
    compiles.wait_all()
    assert len(compiles.status) == 4 and compiles.failed() == 1 and compiles.seconds > 0

    monkeypatch.setattr(compile_pool, "compile_many", lambda js, w: many(js, w, fail_after=3))
    compiles = compile_pool.Compiles(jobs, "sm_90", 3)
    compiles.wait_all()
    assert compiles.failed() == 2 and compiles.verdict(SPEC, C["pd1"]) == "RuntimeError: pool broke"

    monkeypatch.setattr(compile_pool, "compile_many", many)
    release.clear()
    closed.clear()
    compiles = compile_pool.Compiles(jobs, "sm_90", 3)
    compiles.close()                        # returns while the first job runs
    release.set()
    compiles.thread.join(10)
    assert not compiles.thread.is_alive() and closed == [True] and len(compiles.status) == 1
