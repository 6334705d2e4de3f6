"""The performance targets, the one list of them, and their evaluation
against result rows: `opgen bench`'s report shows each run's standing
(report.targets_section) and tests/perf/ holds a GPU run to them.  The
isolated targets are at N = K = 8192 on the isolated figure (opgen_us); the
graph-mode ones (issue 28: decode layers back to back in a CUDA graph) at
8192 x 8192 and 28672 x 8192 on the per-layer figure of graph mode
(opgen_graph_us, or opgen_graph_pdl_us where PDL is faster: graph_figure;
graph.py).  Pure Python."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from .roofline import _r

TARGET_SHAPE = (8192, 8192)
GRAPH_SHAPES = (TARGET_SHAPE, (28672, 8192))
# (GPTQ as the checkpoint stores it, and repacked once at load for the rs GEMM.)
W4_SPECS = ("gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128")
# The graph targets' formats: W4A16 g128 (sym, GPTQ, AWQ), NF4, MXFP4 ...
GRAPH_4BIT_SPECS = W4_SPECS + ("awq_w4a16_g128", "bnb_nf4", "mxfp4")
# ... and the lower-bit ones, W2A16, W1A16, ternary.
GRAPH_LOW_BIT_SPECS = ("w2a16_g128", "w1a16_g128", "bitnet_b158")


@dataclass(frozen=True)
class Target:
    """`metric`: 'vs:PEER' (ratio = PEER µs / opgen µs, must be >= need) or
    'bytes_floor' (ratio = opgen µs / bytes-floor µs, must be <= need).
    Ms: the exact Ms it applies to, or min_M: every measured M >= min_M.
    graph: on graph mode's per-layer figures (graph_figure's, and a peer's
    PEER_graph_us), else the isolated ones; shapes: the (N, K) it is held at."""
    label: str
    specs: Tuple[str, ...]
    metric: str
    need: float
    Ms: Tuple[int, ...] = ()
    min_M: Optional[int] = None
    graph: bool = False
    shapes: Tuple[Tuple[int, int], ...] = (TARGET_SHAPE,)

    @property
    def higher_is_better(self) -> bool:
        return self.metric.startswith("vs:")


TARGETS: Tuple[Target, ...] = (
    Target("W4A16 g128 M=1 vs cuBLAS fp16", W4_SPECS, "vs:cublas_fp16", 4.5, Ms=(1,)),
    Target("W4A16 g128 M=1 vs tinygemm", W4_SPECS, "vs:tinygemm_int4", 2.0, Ms=(1,)),
    Target("W4A16 g128 M=16 vs cuBLAS fp16", W4_SPECS, "vs:cublas_fp16", 3.4, Ms=(16,)),
    Target("W4A16 g128 M=64 vs cuBLAS fp16", W4_SPECS, "vs:cublas_fp16", 1.9, Ms=(64,)),
    Target("W4A16 g128 M=256 vs cuBLAS fp16", W4_SPECS, "vs:cublas_fp16", 0.9, Ms=(256,)),
    Target("W4A16 g128 M=4096 vs cuBLAS fp16", W4_SPECS, "vs:cublas_fp16", 0.8, Ms=(4096,)),
    Target("W2A16 M=1 within 1.4x of byte floor", ("w2a16_g128",), "bytes_floor", 1.4, Ms=(1,)),
    Target("W1A16 M=1 within 1.4x of byte floor", ("w1a16_g128",), "bytes_floor", 1.4, Ms=(1,)),
    Target("ternary M=1 within 1.4x of byte floor", ("bitnet_b158",), "bytes_floor", 1.4, Ms=(1,)),
    Target("NF4 M=1 within 1.5x of byte floor", ("bnb_nf4",), "bytes_floor", 1.5, Ms=(1,)),
    Target("MXFP4 M=1 within 1.5x of byte floor", ("mxfp4",), "bytes_floor", 1.5, Ms=(1,)),
    Target("W8A8 >= 1.0x torch._int_mm, M >= 64", ("w8a8_int8",), "vs:int_mm", 1.0, min_M=64),
    Target("FP8 >= 0.9x torch._scaled_mm, M >= 256", ("fp8_e4m3_w8a8",), "vs:scaled_mm", 0.9,
           min_M=256),
    # graph mode (issue 28), per layer
    Target("graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor", GRAPH_4BIT_SPECS,
           "bytes_floor", 1.2, Ms=(1,), graph=True, shapes=GRAPH_SHAPES),
    Target("graph: W2A16, W1A16, ternary M=1 within 1.5x of byte floor", GRAPH_LOW_BIT_SPECS,
           "bytes_floor", 1.5, Ms=(1,), graph=True, shapes=GRAPH_SHAPES),
    Target("graph: M=16 within 1.5x of byte floor", GRAPH_4BIT_SPECS + GRAPH_LOW_BIT_SPECS,
           "bytes_floor", 1.5, Ms=(16,), graph=True, shapes=GRAPH_SHAPES),
)


def graph_figure(row: dict) -> Tuple[Optional[float], str]:
    """(µs per layer, "plain" or "pdl") a graph target holds for a row."""
    # The faster of the plain and the PDL launch: PDL is an opgen.load option of the same
    # kernels, so either is what opgen's layers do back to back (an unverified PDL figure never).
    plain, pdl = row.get("opgen_graph_us"), row.get("opgen_graph_pdl_us")
    ok = pdl is not None and row.get("graph_pdl_verified") is not False
    if ok and (plain is None or pdl < plain):
        return pdl, "pdl"
    return plain, "plain"


def _target_value(t: Target, row: dict) -> Tuple[Optional[float], Optional[str]]:
    """(ratio, why not) for one row."""
    if t.graph:
        us = graph_figure(row)[0]
        if us is None:
            if row.get("opgen_us") is None:
                return None, "opgen failed" + (f": {row['error']}" if row.get("error") else "")
            if row.get("graph_error"):
                return None, f"graph mode failed: {row['graph_error']}"
            return None, "graph mode not run (--no-graph)"
    else:
        us = row.get("opgen_us")
        if us is None:
            return None, "opgen failed" + (f": {row['error']}" if row.get("error") else "")
    if t.metric.startswith("vs:"):
        peer = t.metric[3:]
        p = row.get(f"{peer}_graph_us" if t.graph else f"{peer}_us")
        if p is None:
            why = (row.get("peer_graph_errors" if t.graph else "peer_errors") or {}).get(peer)
            return None, f"{peer} not measured" + (f": {why}" if why else "")
        return p / us, None
    if t.metric == "bytes_floor":
        f = row.get("bytes_floor_us")
        if not f:
            return None, "no byte floor"
        return us / f, None
    raise ValueError(f"unknown target metric {t.metric!r}")


def evaluate_targets(rows: Iterable[dict], targets: Sequence[Target] = TARGETS,
                     shape: Optional[Tuple[int, int]] = None) -> List[dict]:
    """One entry per (target, shape, spec, M) found at the target's shapes
    (or `shape` for every target): status 'met' / 'missed' (with the
    measured ratio) or 'n/a' (why); a target with no row at one of its
    shapes gets one 'not measured' entry there.  An entry's mode says which
    figure it holds ('graph': the per-layer figure of graph_figure, whose
    launch graph_launch names, besides opgen_us)."""
    rows = list(rows)
    out = []
    for t in targets:
        for N, K in ([tuple(shape)] if shape is not None else t.shapes):
            out += _evaluate(t, [r for r in rows if (r.get("N"), r.get("K")) == (N, K)], N, K)
    return out


def _evaluate(t: Target, rows: List[dict], N: int, K: int) -> List[dict]:
    hits = [r for r in rows if r.get("spec") in t.specs
            and (r.get("M") in t.Ms if t.Ms else (t.min_M is not None and r.get("M", 0) >= t.min_M))]
    hits.sort(key=lambda r: (t.specs.index(r["spec"]), r["M"]))
    base = {"target": t.label, "metric": t.metric, "need": t.need,
            "op": ">=" if t.higher_is_better else "<=", "N": N, "K": K,
            "mode": "graph" if t.graph else "isolated"}
    if not hits:
        return [{**base, "spec": ",".join(t.specs), "M": None, "ratio": None,
                 "status": "not measured", "why": "no such row in this run"}]
    out = []
    for r in hits:
        ratio, why = _target_value(t, r)
        us, launch = graph_figure(r) if t.graph else (r.get("opgen_us"), None)
        needed = None                      # the slowest opgen time that meets the target
        if ratio is None:
            status = "n/a"
        elif t.higher_is_better:
            status = "met" if ratio >= t.need else "missed"
            needed = us * ratio / t.need
        else:
            status = "met" if ratio <= t.need else "missed"
            needed = us * t.need / ratio
        e = {**base, "spec": r["spec"], "M": r["M"], "ratio": _r(ratio), "status": status,
             "opgen_us": r.get("opgen_us"), "needed_us": _r(needed), "read_us": r.get("read_us")}
        if t.graph:
            e.update(opgen_graph_us=us, graph_launch=launch, graph_layers=r.get("graph_layers"),
                     bytes_floor_us=r.get("bytes_floor_us"))
        if why:
            e["why"] = why
        out.append(e)
    return out
