"""Graph mode of `opgen bench` (opgen/bench/graph.py): the layer count,
opgen's layers (plain, and with the PDL kernels) captured and replayed on the numpy workbench
(tests/numpy_device.py; the capture it relies on,
runtime.workbench.Session.capture, is tested in test_workbench.py), errors recorded in
the row; on a GPU (gpu mark), graph-mode rows whose graph outputs must equal
an eager run of the same layers.  The peers' graph mode: test_bench_peers.py."""
import math

import numpy as np
import pytest

from bench_fakes import spec
from numpy_device import FAKE_US, NumpyGraph, NumpySession
from opgen.bench import graph
from opgen.bench.graph import (L2_FACTOR, MAX_LAYERS, MIN_LAYERS, checked_layer_count,
                               layer_count)
from opgen.bench.opgen_rows import as_kernel
from opgen.bench.runner import Gpu
from opgen.codegen import render
from opgen.codegen.tolerance import BENCH_FACTOR, tolerance
from opgen.runtime import op as ops

MB = 1 << 20


def test_layer_count_rule():
    """At least 16 layers, their weights together over 3x the L2, within the
    memory cap (which wins), never more than MAX_LAYERS."""
    l2 = 50 * MB
    # large layers: 16 of them already hold far more than 3 x L2
    assert layer_count(34 * MB, 35 * MB, l2, 4096 * MB) == MIN_LAYERS
    # small layers: as many as it takes to pass 3 x L2 (strictly over)
    L = layer_count(2 * MB, 2 * MB, l2, 4096 * MB)
    assert L == 76 and L * 2 * MB > L2_FACTOR * l2 >= (L - 1) * 2 * MB
    assert layer_count(3 * MB, 3 * MB, l2, 4096 * MB) == 51       # 50 x 3 MB is exactly 3 x L2
    # the memory cap wins over both: 4 GiB holds 8 layers of 470 MiB (fp16 28672 x 8192)
    assert layer_count(470 * MB, 471 * MB, l2, 4096 * MB) == 8
    assert layer_count(470 * MB, 471 * MB, l2, 400 * MB) == 0
    assert layer_count(1024, 2048, l2, 1 << 40) == MAX_LAYERS
    # checked: fewer than 16 is fine while the weights still pass 3 x L2...
    assert checked_layer_count(470 * MB, 471 * MB, l2, 4096 * MB) == 8
    assert checked_layer_count(34 * MB, 35 * MB, l2, 4096 * MB) == 16
    # ...not when the cap (or MAX_LAYERS) leaves them in L2
    with pytest.raises(ValueError, match=r"4 layer\(s\) of .* not over 3x the L2"):
        checked_layer_count(8 * MB, 8 * MB, l2, 32 * MB)
    with pytest.raises(ValueError, match="0 layer"):
        checked_layer_count(470 * MB, 471 * MB, l2, 400 * MB)
    with pytest.raises(ValueError, match=f"at most {MAX_LAYERS}"):
        checked_layer_count(1024, 1024, l2, 1 << 40)


def _problem(session, name="w4a16_sym_g128", N=256, K=256, M=1, mem_cap=1 << 28):
    s = spec(name)
    p = session.problem(s, N, K, 0, mem_cap)
    p.select(M)
    return s, p


def _session(l2=64 << 10, fault=None):
    s = NumpySession(fault)
    s.l2 = l2
    return s


@pytest.mark.parametrize("name,M", [("w4a16_sym_g128", 1), ("bnb_nf4", 16), ("w8a8_int8", 4)])
def test_time_opgen(name, M):
    """L distinct weight sets (each layer its own), the per-layer figure,
    the graph's outputs checked against the eager run."""
    session = _session()
    s, p = _problem(session, name, M=M)
    kernel = session.kernel(s, "cfg")
    out = graph.time_opgen(p, kernel, budget_ms=1.0, tol=BENCH_FACTOR * tolerance(s))
    w_bytes = sum(w.nbytes for w in p.w_sets[0].values())
    L = out["graph_layers"]
    assert "graph_error" not in out, out
    assert L >= MIN_LAYERS and out["graph_bytes"] == L * w_bytes > L2_FACTOR * session.l2
    assert len(p.w_sets) >= L and len({id(w["qweight"]) for w in p.w_sets[:L]}) == L
    assert out["opgen_graph_us"] == round(FAKE_US / L, 4)
    assert out["graph_verified"] is True and out["graph_rel_err"] == 0.0
    # captured once; replayed once for the check, then by the timer (three times here)
    assert len(session.graphs) == 1 and session.graphs[0].launches == 1 + 3


def test_time_opgen_without_check():
    session = _session()
    s, p = _problem(session)
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0, tol=None)
    assert "graph_verified" not in out and out["opgen_graph_us"] > 0
    assert session.graphs[0].launches == 3


def test_time_opgen_within_the_memory_cap():
    """The cap wins over L >= 16 while the weights still pass 3 x L2; below
    that the row records why it has no graph figure."""
    session = _session(l2=16 << 10)
    s, p = _problem(session, mem_cap=1 << 28)
    w = sum(x.nbytes for x in p.w_sets[0].values())
    p.mem_cap = 10 * (w + 512)
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0, tol=None)
    assert out["graph_layers"] == 10 and out["opgen_graph_us"] == round(FAKE_US / 10, 4)
    p.mem_cap = 2 * w
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0, tol=None)
    assert out["graph_error"].startswith("layers: ValueError: 1 layer(s)")
    assert "opgen_graph_us" not in out


def test_graph_errors_are_recorded(monkeypatch):
    """A capture that fails, and a graph that does not write its outputs:
    the row says so, nothing is raised."""
    session = _session()
    s, p = _problem(session)
    kernel = session.kernel(s, "cfg")

    def refuse(enqueue):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(session, "capture", refuse)
    out = graph.time_opgen(p, kernel, budget_ms=1.0, tol=1e-3)
    assert out["graph_error"] == ("capture: RuntimeError: operation not permitted when stream "
                                  "is capturing")
    assert "opgen_graph_us" not in out and out["graph_layers"] >= MIN_LAYERS

    class Idle:
        def launch(self, stream=None):
            pass
    monkeypatch.setattr(session, "capture", lambda enqueue: Idle())
    out = graph.time_opgen(p, kernel, budget_ms=1.0, tol=1e-3)
    assert out["graph_verified"] is False and out["graph_rel_err"] is None
    assert "NaN/Inf after one replay" in out["graph_verify_msg"]


def test_time_opgen_with_pdl():
    """The PDL variant: the same L layers (weights, outputs) with the pdl
    kernel, captured into a graph of its own, timed and checked the same
    way, into the graph_pdl fields beside the plain ones."""
    session = _session()
    s, p = _problem(session)
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0,
                           tol=BENCH_FACTOR * tolerance(s), pdl_kernel=session.kernel(s, "cfg"))
    L = out["graph_layers"]
    assert "graph_error" not in out and "graph_pdl_error" not in out, out
    assert out["opgen_graph_us"] == out["opgen_graph_pdl_us"] == round(FAKE_US / L, 4)
    assert out["graph_verified"] is True and out["graph_pdl_verified"] is True
    assert out["graph_pdl_rel_err"] == 0.0 and len(p.w_sets) == L      # the same layers
    assert [g.launches for g in session.graphs] == [1 + 3, 1 + 3]


def test_pdl_variant_is_checked_against_the_plain_kernels():
    """The PDL graph's outputs are compared with the plain kernels' eager
    run: a pdl kernel that computes otherwise fails its check even where its
    own eager run agrees with its graph; its failures are its own."""
    session = _session(fault="half_k")
    s, p = _problem(session)
    tol = BENCH_FACTOR * tolerance(s)
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0, tol=tol,
                           pdl_kernel=session.kernel(s, "faulty"))
    assert out["graph_verified"] is True and out["graph_pdl_verified"] is False
    assert "graph differs from the eager run" in out["graph_pdl_verify_msg"]
    assert out["opgen_graph_pdl_us"] > 0                 # still timed, as the plain graph is

    captures = []

    def capture(enqueue):
        captures.append(enqueue)
        if len(captures) == 2:
            raise RuntimeError("cuLaunchKernelEx refused")
        return NumpyGraph(enqueue)
    session = _session()
    s, p = _problem(session)
    session.capture = capture
    out = graph.time_opgen(p, session.kernel(s, "cfg"), budget_ms=1.0, tol=tol,
                           pdl_kernel=session.kernel(s, "cfg"))
    assert out["graph_verified"] is True and out["opgen_graph_us"] > 0
    assert out["graph_pdl_error"] == "capture: RuntimeError: cuLaunchKernelEx refused"
    assert "opgen_graph_pdl_us" not in out and "graph_pdl_verified" not in out


def test_compare():
    a = [np.ones((2, 4), np.float32), np.full((2, 4), 2, np.float32)]
    assert graph.compare(a, [x.copy() for x in a]) == (0, 0.0)
    bad, err = graph.compare(a, [a[0], a[1] * 1.01])
    assert bad == 0 and math.isclose(err, 0.01, rel_tol=1e-4)
    assert graph.compare(a, [a[0], np.full((2, 4), np.nan, np.float32)])[0] == 8


# --- on a GPU ------------------------------------------------------------------------

@pytest.mark.gpu
def test_graph_mode_on_the_gpu(record):
    """Graph-mode rows on the device: opgen's op captured into CUDA graphs
    (on sm_90+ also its PDL kernels); the per-layer figures finite and
    positive, at least 16 layers whose weights pass 3x the L2, and the
    graph's outputs (poisoned, one replay) equal to an eager run of the same
    layers."""
    pytest.importorskip("torch")
    g = Gpu(budget_ms=5, mem_cap=4 << 30)
    names = ("w4a16_sym_g128", "gptq_v2_w4a16_g128")       # (the second runs transcoded)
    for name in names:
        rows = g.time_spec(spec(name), 4096, 4096, [1, 16], db=None, use_db=False, verify=True,
                           graph=True)
        for r in rows:
            assert r.get("error") is None and r.get("graph_error") is None, r
            us = r["opgen_graph_us"]
            assert math.isfinite(us) and 0 < us < 10 * r["opgen_us"], r
            assert r["graph_layers"] >= MIN_LAYERS and r["graph_bytes"] > L2_FACTOR * g.l2
            assert r["graph_verified"] is True, r
            pdl_us = r.get("opgen_graph_pdl_us")
            if render.pdl_available(g.arch):           # the same layers' PDL kernels, checked too
                assert r.get("graph_pdl_error") is None and r["graph_pdl_verified"] is True, r
                assert math.isfinite(pdl_us) and 0 < pdl_us < 10 * r["opgen_us"], r
            record(check="bench graph mode", spec=name, M=r["M"], layers=r["graph_layers"],
                   graph_us=us, graph_pdl_us=pdl_us, isolated_us=r["opgen_us"],
                   rel_err=r["graph_rel_err"], pdl_rel_err=r.get("graph_pdl_rel_err"))
    # the same layers by hand: eager outputs, then the graph's after a poisoned replay
    # (equal up to the order of split-K's atomic fp32 sums)
    op = ops.load(spec("w4a16_sym_g128"), N=4096, K=4096, use_db=False)
    if op.kernel_spec is not op.spec:                      # as the bench: the kernels' layout
        op = ops.load(op.kernel_spec, N=4096, K=4096, use_db=False)
    session = g.session
    p = session.problem(op.spec, 4096, 4096, 0, 4 << 30)
    try:
        p.select(1)
        layers = graph.OpgenLayers(p, as_kernel(op), MIN_LAYERS)
        with session.stream:
            layers.enqueue()
        session.synchronize()
        eager = layers.host_outs()
        cuda_graph = session.capture(layers.enqueue)
        with session.stream:
            for o in layers.outs:
                o.fill(np.nan)
            cuda_graph.launch(session.stream)
        session.synchronize()
        bad, err = graph.compare(eager, layers.host_outs())
        assert bad == 0 and err <= 1e-3, (bad, err)
        assert all(np.isfinite(e).all() and np.abs(e).max() > 0 for e in eager)
    finally:
        p.close()
    g.free()
