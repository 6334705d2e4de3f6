"""The performance targets (at N = K = 8192), the one list of them, and their
evaluation against result rows: `opgen bench`'s report shows each run's
standing (report.targets_section) and tests/perf/ holds a GPU run to them.
Pure Python."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from .roofline import _r

TARGET_SHAPE = (8192, 8192)
# (GPTQ as the checkpoint stores it, and repacked once at load for the rs GEMM.)
W4_SPECS = ("gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128")


@dataclass(frozen=True)
class Target:
    """`metric`: 'vs:PEER' (ratio = PEER µs / opgen µs, must be >= need) or
    'bytes_floor' (ratio = opgen µs / bytes-floor µs, must be <= need).
    Ms: the exact Ms it applies to, or min_M: every measured M >= min_M."""
    label: str
    specs: Tuple[str, ...]
    metric: str
    need: float
    Ms: Tuple[int, ...] = ()
    min_M: Optional[int] = None

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
)


def _target_value(t: Target, row: dict) -> Tuple[Optional[float], Optional[str]]:
    """(ratio, why not) for one row."""
    us = row.get("opgen_us")
    if us is None:
        return None, "opgen failed" + (f": {row['error']}" if row.get("error") else "")
    if t.metric.startswith("vs:"):
        peer = t.metric[3:]
        p = row.get(f"{peer}_us")
        if p is None:
            why = (row.get("peer_errors") or {}).get(peer)
            return None, f"{peer} not measured" + (f": {why}" if why else "")
        return p / us, None
    if t.metric == "bytes_floor":
        f = row.get("bytes_floor_us")
        if not f:
            return None, "no byte floor"
        return us / f, None
    raise ValueError(f"unknown target metric {t.metric!r}")


def evaluate_targets(rows: Iterable[dict], targets: Sequence[Target] = TARGETS,
                     shape: Tuple[int, int] = TARGET_SHAPE) -> List[dict]:
    """One entry per (target, spec, M) found at `shape`: status 'met' / 'missed'
    (with the measured ratio) or 'n/a' (why); a target with no row at all gets
    one 'not measured' entry."""
    rows = [r for r in rows if (r.get("N"), r.get("K")) == tuple(shape)]
    out = []
    for t in targets:
        hits = [r for r in rows if r.get("spec") in t.specs
                and (r.get("M") in t.Ms if t.Ms else (t.min_M is not None and r.get("M", 0) >= t.min_M))]
        hits.sort(key=lambda r: (t.specs.index(r["spec"]), r["M"]))
        base = {"target": t.label, "metric": t.metric, "need": t.need,
                "op": ">=" if t.higher_is_better else "<=", "N": shape[0], "K": shape[1]}
        if not hits:
            out.append({**base, "spec": ",".join(t.specs), "M": None, "ratio": None,
                        "status": "not measured", "why": "no such row in this run"})
            continue
        for r in hits:
            ratio, why = _target_value(t, r)
            needed = None                      # the slowest opgen time that meets the target
            if ratio is None:
                status = "n/a"
            elif t.higher_is_better:
                status = "met" if ratio >= t.need else "missed"
                needed = r["opgen_us"] * ratio / t.need
            else:
                status = "met" if ratio <= t.need else "missed"
                needed = r["opgen_us"] * t.need / ratio
            e = {**base, "spec": r["spec"], "M": r["M"], "ratio": _r(ratio), "status": status,
                 "opgen_us": r.get("opgen_us"), "needed_us": _r(needed), "read_us": r.get("read_us")}
            if why:
                e["why"] = why
            out.append(e)
    return out
