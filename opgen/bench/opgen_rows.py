"""opgen's rows of `opgen bench`: for each (spec, N, K, M) the kernel
`opgen.load(spec, N, K)` picks (its tuning-DB winner or the heuristic's
pick; which one is recorded), checked and timed on the runtime workbench's
tiled problem, and for int8/fp8 activations opgen's fused linear from fp16
activations (quantize + GEMM); with graph, for M <= graph.MAX_M also the op
in graph mode (graph.py), and with pdl (where the arch has it) the same op
loaded with pdl=True in graph mode too.  `session` is a
runtime.workbench.Session (tests put a numpy one in its place)."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, List, Optional, Sequence

from ..codegen import render
from ..codegen.buckets import bucket_of
from ..codegen.tolerance import BENCH_FACTOR, tolerance
from ..runtime import op as ops
from . import graph as graph_mode
from .failures import short_error
from .roofline import _r

LINEAR_INPUT = "float16"          # the fused linear's input dtype


def as_kernel(op, linear: bool = False):
    """An op (MatmulOp, or QuantizedLinearOp with linear=True) called as the
    workbench calls kernels, on the caller's current stream."""
    if linear:
        def kernel(x, w, out, a_scale=None, bias=None, stream=None):
            op(x, w["qweight"], w.get("scales"), w.get("zeros"), bias=bias, out=out)
    else:
        def kernel(a, w, out, a_scale=None, bias=None, stream=None):
            op(a, w["qweight"], w.get("scales"), w.get("zeros"), bias=bias, a_scale=a_scale,
               out=out)
    return kernel


def _check(problem, kernel, tol: float) -> dict:
    ok, err, why = problem.verify(kernel, tol)
    out = {"verified": ok, "rel_err": None if math.isinf(err) else err}
    if not ok:
        out["verify_msg"] = why
    return out


def time_spec(session, spec, N: int, K: int, Ms: Sequence[int], *, db, use_db: bool,
              verify: bool, graph: bool, budget_ms: float, seed: int, mem_cap: int,
              log: Callable[[str], None], pdl: bool = True) -> List[dict]:
    """Rows for (spec, N, K, each M): opgen's matmul on quantized activations
    (opgen_us), with graph and M <= graph.MAX_M the same in graph mode
    (opgen_graph_us per layer, graph_layers, ...: graph.time_opgen; with pdl,
    on an arch that has it, also opgen_graph_pdl_us, ...: the op loaded with
    pdl=True, the same configs) and, for int8/fp8 activations, opgen's fused
    linear from fp16 activations (opgen_linear_us).  A row is checked
    (verified, rel_err) within BENCH_FACTOR x the tolerance before it is
    timed."""
    rows = {M: {"spec": spec.name, "N": N, "K": K, "M": M, "opgen_us": None} for M in Ms}
    tol = BENCH_FACTOR * tolerance(spec)
    try:
        op = ops.load(spec, N=N, K=K, db=db, use_db=use_db)
        prepare_ms = _time_prepare(session, op, seed, mem_cap)
        if op.kernel_spec is not op.spec:
            # Timed on weights drawn in the storage the kernels read: the
            # transcode there is bit-exact (codegen/transcode.py), and its own
            # time is the row's prepare_ms.
            for r in rows.values():
                r.update(layout=op.kernel_spec.name, prepare_ms=prepare_ms)
            op = ops.load(op.kernel_spec, N=N, K=K, db=db, use_db=use_db)
        problem = session.problem(op.spec, N, K, seed, mem_cap)
        pdl_op = None
        if graph and pdl and render.pdl_available(session.arch):
            pdl_op = ops.load(op.spec, N=N, K=K, db=db, use_db=use_db, pdl=True)
    except Exception as e:
        for r in rows.values():
            r["error"] = "setup: " + short_error(e)
        log(f"{spec.name} {N}x{K}: setup failed: {rows[Ms[0]]['error']}")
        return list(rows.values())
    lin = lin_error = None
    if spec.a.scale == "row":
        try:
            lin = ops.load_linear(op.spec, N, K, input_dtype=LINEAR_INPUT, db=db, use_db=use_db)
        except Exception as e:
            lin_error = short_error(e)
    try:
        for M in Ms:
            r = rows[M]
            r["base_shape"] = [problem.N0, problem.K0]
            try:
                problem.select(M)
                kernel = as_kernel(op)
                r["config"] = op.kernel_for(M).config.name
                r["bucket"] = bucket_of(M)
                r["source"] = op.sources.get(r["bucket"])
                if verify:
                    r.update(_check(problem, kernel, tol))
                t = problem.time(kernel, budget_ms=budget_ms)
                r["opgen_us"] = _r(t.median_us)
                r["samples"] = len(t.samples)
                r["copies"] = len(problem.acts)
                log(f"{spec.name} {N}x{K} M={M}: {t.median_us:.2f} us ({r['config']}, "
                    f"{r['source']})" + ("" if r.get("verified") is not False else "  OUTPUT WRONG"))
                if graph and M <= graph_mode.MAX_M:
                    _time_graph(problem, kernel, pdl_op, r, verify, tol, budget_ms, log)
            except Exception as e:
                r["error"] = short_error(e)
                log(f"{spec.name} {N}x{K} M={M}: failed: {r['error']}")
            if lin_error is not None:
                r["opgen_linear_error"] = lin_error
            elif lin is not None:
                _time_linear(problem, lin, r, M, verify, tol, budget_ms, log)
    finally:
        problem.close()
    return [rows[M] for M in Ms]


def _time_prepare(session, op, seed: int, mem_cap: int, repeats: int = 5) -> Optional[float]:
    """Median milliseconds of op.prepare on a whole layer stored as op.spec
    stores it, on the session's device; None when the kernels read the
    spec's own storage."""
    if op.kernel_spec is op.spec:
        return None
    stored = session.problem(op.spec, op.N, op.K, seed, mem_cap)
    try:
        times = []
        for _ in range(repeats):
            session.synchronize()
            t0 = time.perf_counter()
            op.prepare(**stored.w_sets[0])
            session.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        stored.close()
    return round(statistics.median(times), 3)


def _time_graph(problem, kernel, pdl_op, r: dict, verify: bool, tol: float, budget_ms: float,
                log) -> None:
    spec, N, K, M = problem.spec, problem.N, problem.K, problem.M
    r.update(graph_mode.time_opgen(problem, kernel, budget_ms=budget_ms,
                                   tol=tol if verify else None,
                                   pdl_kernel=None if pdl_op is None else as_kernel(pdl_op)))
    where = f"{spec.name} {N}x{K} M={M}: graph"
    if r.get("graph_error"):
        log(f"{where} failed: {r['graph_error']}")
    else:
        log(f"{where} of {r['graph_layers']} layers: {r['opgen_graph_us']:.2f} us per layer"
            + ("" if r.get("graph_verified") is not False else "  OUTPUT WRONG"))
    if r.get("graph_pdl_error"):
        log(f"{where} with PDL failed: {r['graph_pdl_error']}")
    elif "opgen_graph_pdl_us" in r:
        log(f"{where} with PDL: {r['opgen_graph_pdl_us']:.2f} us per layer"
            + ("" if r.get("graph_pdl_verified") is not False else "  OUTPUT WRONG"))


def _time_linear(problem, lin, r: dict, M: int, verify: bool, tol: float, budget_ms: float,
                 log) -> None:
    spec, N, K = problem.spec, problem.N, problem.K
    try:
        problem.select(M, input_dtype=LINEAR_INPUT)
        kernel = as_kernel(lin, linear=True)
        if verify:
            chk = _check(problem, kernel, tol)
            r["linear_verified"] = chk["verified"]
            r["linear_rel_err"] = chk["rel_err"]
        t = problem.time(kernel, budget_ms=budget_ms)
        r["opgen_linear_us"] = _r(t.median_us)
        log(f"{spec.name} {N}x{K} M={M}: linear (quantize + GEMM) {t.median_us:.2f} us"
            + ("" if r.get("linear_verified") is not False else "  OUTPUT WRONG"))
    except Exception as e:
        r["opgen_linear_error"] = short_error(e)
        log(f"{spec.name} {N}x{K} M={M}: linear failed: {r['opgen_linear_error']}")
