"""Graph mode of `opgen bench`: a decode step runs its linear layers back to
back inside one CUDA graph, where no launch waits on Python and the next
layer's weights (the whole cost at small M) do not depend on the previous
layer's output.  So for each row (spec, N, K, M <= MAX_M) L distinct layers
of that shape are captured once into one CUDA graph and the graph replayed
under runtime.timing.Timer (CUDA events, median); the figure is µs per layer
(median / L: the graph launch's own start-up is spread over the L layers, as
over a model's step), reported beside the isolated one.

* L (layer_count): at least MIN_LAYERS, and enough that the L layers' weights
  together are over L2_FACTOR x the L2, so a replay finds none of a layer's
  weights left in L2 from the previous replay; at most MAX_LAYERS; and the
  layers must fit the memory a problem may use (the bench's --mem-cap-gb),
  which wins: fewer layers are timed (the row says how many) as long as
  their weights are still over L2_FACTOR x the L2, else the row records an
  error.
* Inputs: each layer reads its own activation, not the previous layer's
  output.  In a graph captured from one stream every kernel node follows the
  previous one whatever it reads, so a data chain would add no ordering, and
  the weights do not depend on it.  A chain also exists only where the
  activation's type is the output's and N == K (not for int8/fp8
  activations, nor 28672 x 8192), and the tiled test data grow by about
  K / K0 per layer: 16 chained fp16 layers would be timing infinities.
  Each layer has its own weights and writes its own output.
* Warm-up: every layer runs once eagerly on the capture stream first (first
  calls load kernels and make the split-K workspaces and predecode scratch,
  per stream; nothing may allocate during capture).
* Check (opgen): the eager outputs are kept, the outputs poisoned, the
  graph replayed once: every output must come back finite and equal to the
  eager one within the tolerance (graph_verified, graph_rel_err).
* Only M <= MAX_M (decode, speculative decoding, small batches): above it a
  launch's start-up and tail are a small part of its time, and a graph row
  costs L times an isolated one.
* PDL (where the arch has it, render.pdl_available): the same L layers with their
  kernels built for programmatic dependent launch (Kernel(pdl=True):
  runtime/pdl.py's launch, which the capture records as programmatic edges),
  so that each layer starts under the previous one's tail; warmed up,
  captured, checked (against the plain kernels' eager outputs) and timed
  the same way: opgen_graph_pdl_us, graph_pdl_verified, graph_pdl_rel_err,
  graph_pdl_error.

opgen's layers run on the runtime workbench (Session.capture: CuPy's stream
capture), here; the peers' in torch (peers.py, runner.Gpu.capture:
torch.cuda.CUDAGraph), with the same layer count.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from ..codegen import render
from ..runtime import tiled
from .failures import short_error
from .roofline import _r

MIN_LAYERS = 16          # layers in one graph, at least...
L2_FACTOR = 3            # ...and their weights together over this many L2s
MAX_LAYERS = 1024        # (tiny layers: the L2 rule alone would ask for thousands)
MAX_M = 16               # graph mode for rows up to this M

METHOD = (f"L distinct layers (own weights each; L >= {MIN_LAYERS}, their weights together > "
          f"{L2_FACTOR}x L2, within the memory cap) captured once into one CUDA graph, replayed "
          f"under CUDA events; median per replay / L; rows with M <= {MAX_M}")
PDL_METHOD = ("the same layers with kernels built and launched for programmatic dependent "
              "launch (each starts under the previous one's tail), captured and timed the same "
              f"way; sm_{render.PDL_MIN_CC}+")


def layer_count(weight_bytes: int, layer_bytes: int, l2: int, cap: int) -> int:
    """L for layers of weight_bytes of weights and layer_bytes of memory in
    all: max(MIN_LAYERS, the fewest whose weights exceed L2_FACTOR x l2), at
    most MAX_LAYERS, and at most what fits in cap bytes (0: not one)."""
    want = max(MIN_LAYERS, L2_FACTOR * l2 // max(weight_bytes, 1) + 1)
    return max(0, min(want, MAX_LAYERS, cap // max(layer_bytes, 1)))


def checked_layer_count(weight_bytes: int, layer_bytes: int, l2: int, cap: int) -> int:
    """layer_count, or ValueError when the layers that fit (or MAX_LAYERS)
    hold no more than L2_FACTOR x l2 of weights: a replay would then read
    weights the previous one left in L2."""
    L = layer_count(weight_bytes, layer_bytes, l2, cap)
    if L * weight_bytes <= L2_FACTOR * l2:
        raise ValueError(
            f"{L} layer(s) of {weight_bytes / 1e6:.3g} MB of weights fit (memory cap "
            f"{cap / 1e6:.4g} MB, at most {MAX_LAYERS}): not over {L2_FACTOR}x the L2 "
            f"({l2 / 1e6:.3g} MB)")
    return L


class OpgenLayers:
    """L layers of a workbench problem (runtime.workbench.Problem, M
    selected): layer i reads the problem's activation copy i % n and weight
    set i (added to problem.w_sets as needed) and writes outs[i]."""

    def __init__(self, problem, kernel, L: int):
        xp, M, N = problem.xp, problem.M, problem.N
        while len(problem.w_sets) < L:
            problem.w_sets.append({k: w.copy() for k, w in problem.w_sets[0].items()})
        self.problem, self.kernel, self.L = problem, kernel, L
        self.outs = [xp.empty((M, N), dtype=tiled.out_dtype(problem.spec)) for _ in range(L)]
        problem.session.synchronize()       # (made on the default stream)

    @staticmethod
    def sizes(problem) -> tuple:
        """(weight bytes, memory bytes) of one layer."""
        w = sum(int(t.nbytes) for t in problem.w_sets[0].values())
        return w, w + problem.M * problem.N * np.dtype(tiled.out_dtype(problem.spec)).itemsize

    def enqueue(self) -> None:
        p, stream = self.problem, self.problem.session.stream
        acts, n = p.acts, len(p.acts)
        for i in range(self.L):
            a, a_scale = acts[i % n]
            self.kernel(a, p.w_sets[i], self.outs[i], a_scale=a_scale, bias=p.bias, stream=stream)

    def host_outs(self) -> List[np.ndarray]:
        p = self.problem
        return [tiled.out_to_f32(p.spec, p.session.to_host(o)) for o in self.outs]


def compare(eager: List[np.ndarray], got: List[np.ndarray]) -> tuple:
    """(outputs not finite, the largest relative error of a layer's output)."""
    bad = sum(int((~np.isfinite(g)).sum()) for g in got)
    err = 0.0
    for e, g in zip(eager, got):
        e64, g64 = e.astype(np.float64), g.astype(np.float64)
        if np.isfinite(g64).all():
            d = np.linalg.norm(g64 - e64) / max(np.linalg.norm(e64), 1e-30)
            err = max(err, float(d))
    return bad, err


def time_opgen(problem, kernel, *, budget_ms: float, tol: Optional[float],
               pdl_kernel=None) -> dict:
    """opgen's graph-mode fields of a row (problem at its selected M):
    graph_layers, graph_bytes (weights of all the layers), opgen_graph_us
    (µs per layer) and, with tol, graph_verified and graph_rel_err; or
    graph_error.  pdl_kernel: the same op built with pdl, timed on the same
    layers into the graph_pdl fields (opgen_graph_pdl_us, ...)."""
    session = problem.session
    out: dict = {}
    try:
        w_bytes, layer_bytes = OpgenLayers.sizes(problem)
        cap = min(problem.mem_cap, session.free_bytes() // 4)
        L = checked_layer_count(w_bytes, layer_bytes, session.l2, cap)
        out.update(graph_layers=L, graph_bytes=L * w_bytes)
        layers = OpgenLayers(problem, kernel, L)
    except Exception as e:
        out["graph_error"] = "layers: " + short_error(e)
        return out
    eager = _time_variant(problem, layers, kernel, "graph", budget_ms, tol, None, out)
    if pdl_kernel is not None:
        _time_variant(problem, layers, pdl_kernel, "graph_pdl", budget_ms, tol, eager, out)
    return out


def _time_variant(problem, layers: OpgenLayers, kernel, key: str, budget_ms: float,
                  tol: Optional[float], eager, out: dict):
    """The layers launched by `kernel`: warmed up, captured, checked against
    `eager` (the outputs of an eager run, else this one's) and timed into
    out's opgen_{key}_us, {key}_verified, {key}_rel_err or {key}_error.
    Returns the eager outputs it checked against (None without tol)."""
    session = problem.session
    layers.kernel = kernel
    stage = "warm-up"
    try:
        with session.stream:
            layers.enqueue()
        session.synchronize()
        if tol is not None and eager is None:
            eager = layers.host_outs()
        stage = "capture"
        graph = session.capture(layers.enqueue)
        if tol is not None:
            stage = "replay"
            _check(problem, layers, graph, eager, tol, out, key)
        stage = "timing"
        t = session.timer.measure(lambda i: graph.launch(session.stream), None,
                                  budget_us=budget_ms * 1e3)
        out[f"opgen_{key}_us"] = _r(t.median_us / layers.L)
    except Exception as e:
        out[f"{key}_error"] = f"{stage}: " + short_error(e)
    return eager


def _check(problem, layers: OpgenLayers, graph, eager, tol: float, out: dict, key: str) -> None:
    session, spec = problem.session, problem.spec
    with session.stream:
        for o in layers.outs:
            o.fill(tiled.poison(spec))
        graph.launch(session.stream)
    session.synchronize()
    bad, err = compare(eager, layers.host_outs())
    out[f"{key}_verified"] = bad == 0 and err <= tol
    out[f"{key}_rel_err"] = err if bad == 0 else None
    if bad:
        out[f"{key}_verify_msg"] = f"{bad} outputs NaN/Inf after one replay (unwritten?)"
    elif err > tol:
        out[f"{key}_verify_msg"] = (f"graph differs from the eager run: relative error "
                                    f"{err:.2e} > {tol:.2e}")
