"""Compiling ahead for `opgen bench` (opgen/bench/precompile.py): the
kernels opgen.load will pick, compiled into the cubin cache in the
background (NVRTC needs no GPU), waited for or cancelled."""
import threading

import pytest

from bench_fakes import spec
from opgen.bench import precompile
from opgen.codegen.compiler import cache_dir
from opgen.runtime import compile_pool


def test_precompile_fills_the_cubin_cache(monkeypatch, tmp_path):
    """The background compile (spawned workers) leaves every kernel the op will
    pick in the cubin cache."""
    pytest.importorskip("cupy")
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    specs = [spec("w4a16_sym_g128"), spec("w8a8_int8")]
    jobs = precompile.compile_jobs(specs, [(256, 512)], [1, 2, 64], None, False, "sm_90")
    assert len(jobs) == len(set(jobs)) >= 3
    # w8a8: the quantize kernel of the fused linear as well
    assert [j[0].name for j in jobs if j[1] is None] == ["quantize_int8_float16"]
    logs = []
    precompile.wait(precompile.start(jobs, "sm_90", 2, logs.append), logs.append)
    assert len(list(cache_dir().glob("*.cubin"))) == len(jobs)
    assert logs[0] == f"compiling {len(jobs)} kernels (2 processes)"
    assert "(0 failed; those rows will say why)" in logs[-1]


def test_graph_modes_pdl_kernels_are_compiled_ahead_too():
    """pdl_Ms: the picks of those Ms also as (spec, config, True), the
    kernels graph mode runs with programmatic dependent launch."""
    s = spec("w4a16_sym_g128")
    plain = precompile.compile_jobs([s], [(256, 512)], [1, 64], None, False, "sm_90")
    both = precompile.compile_jobs([s], [(256, 512)], [1, 64], None, False, "sm_90", pdl_Ms=[1])
    assert all(len(j) == 2 for j in plain)
    assert [j for j in both if len(j) == 3] == [plain[0] + (True,)]
    assert [j for j in both if len(j) == 2] == plain


def test_precompile_background_wait_and_cancel(monkeypatch):
    """start returns at once while a thread drains compile_many; wait counts
    the failures (jobs never reported too); cancel returns at once and the
    thread closes compile_many after the job in flight."""
    logs = []
    jobs = [("spec", i) for i in range(6)]
    release, closed = threading.Event(), []

    def many(js, workers, fail_after=None):
        assert [j[:2] for j in js] == jobs and workers == 3
        try:
            for k, j in enumerate(js):
                assert release.wait(10)
                if k == fail_after:
                    raise RuntimeError("pool broke")
                yield j, ("CompileError: x" if j[1] == 2 else None)
        finally:
            closed.append(True)

    monkeypatch.setattr(compile_pool, "compile_many", many)
    release.set()
    precompile.wait(precompile.start(jobs, "sm_90", 3, logs.append), logs.append)
    assert "compiled 6 kernels" in logs[-1] and "(1 failed;" in logs[-1]

    monkeypatch.setattr(compile_pool, "compile_many", lambda js, w: many(js, w, fail_after=4))
    precompile.wait(precompile.start(jobs, "sm_90", 3, logs.append), logs.append)
    assert "(3 failed;" in logs[-1]                  # job 2, and the two never reported

    monkeypatch.setattr(compile_pool, "compile_many", many)
    release.clear()
    closed.clear()
    handle = precompile.start(jobs, "sm_90", 3, logs.append)
    precompile.cancel(handle)                        # returns while the first job runs
    release.set()
    handle.thread.join(10)
    assert not handle.thread.is_alive() and closed == [True] and len(handle.status) == 1
    assert precompile.start([], "sm_90", 3, logs.append) is None
