"""`opgen bench` (also `python -m opgen.bench`): opgen's kernels against the
peers on one GPU, in one process, on the same shapes.

For every (spec, N, K, M) it times the kernel `opgen.load(spec, N, K)` picks
(tuning-DB winner or the planner's heuristic; which one is recorded), and for
every (N, K, M) the peers: cuBLAS fp16 / bf16 (`torch.mm`), tinygemm int4
(`torch._weight_int4pack_mm`), cuBLASLt int8 (`torch._int_mm`), fp8
(`torch._scaled_mm`) and the unfused BMINF-style W8A8 pipeline (per-row
quantize in torch ops, `torch._int_mm`, scale).  In the same run it measures
the machine: device-to-device copy bandwidth and the dense fp16 / int8 / fp8
matmul ceilings (cuBLAS at 8192^3), from which each row's floor is
max(bytes moved / copy bandwidth, flops / ceiling).  Writes bench.json,
bench.md, speedup.png and floor.png to --out.

Timing: runtime.tuner's _Timer (CUDA events; launches queued behind a spin
kernel so Python's launch cost is hidden; median of samples; a device-time
budget per measurement), with several copies of every input rotated so that
one launch does not find the previous launch's data in L2.

Layout: everything down to `run` is pure Python (argument parsing, floors,
targets, Markdown, plots) and imports neither torch nor cupy, so it is tested
on CPU; the GPU part (`_Gpu` and below) imports them inside functions.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# --- what to run ------------------------------------------------------------------

DEFAULT_SHAPES: Tuple[Tuple[int, int], ...] = (
    (4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))
DEFAULT_MS: Tuple[int, ...] = (1, 16, 32, 64, 128, 256, 1024, 4096)
QUICK_SHAPES: Tuple[Tuple[int, int], ...] = ((8192, 8192),)
QUICK_MS: Tuple[int, ...] = (1, 16, 64, 256, 4096)
QUICK_SPECS: Tuple[str, ...] = (
    "gptq_v2_w4a16_g128", "w4a16_sym_g128", "w2a16_g128", "w1a16_g128", "bitnet_b158",
    "bnb_nf4", "mxfp4", "w8a8_int8", "fp8_e4m3_w8a8")
DEFAULT_OUT = os.path.join("bench", "results", "h200")
DEFAULT_BUDGET_MS = 20.0       # device time per measurement (the tuner uses 30)
DEFAULT_MEM_CAP_GB = 4.0       # most memory the rotating copies of one problem may take

# Peers, in table order.  Each is timed once per (N, K, M) and shared by all specs.
PEERS: Tuple[str, ...] = ("cublas_fp16", "cublas_bf16", "tinygemm_int4", "int_mm",
                          "scaled_mm", "bminf_w8a8")
PEER_LABELS = {
    "cublas_fp16": "cuBLAS fp16", "cublas_bf16": "cuBLAS bf16",
    "tinygemm_int4": "tinygemm int4", "int_mm": "torch._int_mm",
    "scaled_mm": "torch._scaled_mm", "bminf_w8a8": "BMINF W8A8 (unfused)",
}
BASELINE = "cublas_fp16"

# Ceilings measured at start-up (see _Gpu.measure_machine); keys of "measured".
PEAK_FOR_ACT = {"float16": "fp16_tflops", "bfloat16": "fp16_tflops", "int8": "int8_tops",
                "float8_e4m3": "fp8_tflops"}


# --- argument parsing -----------------------------------------------------------------

def parse_ints(text: str) -> List[int]:
    """'1,16,64' -> [1, 16, 64] (positive, duplicates dropped, order kept)."""
    try:
        vals = [int(v, 0) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return list(dict.fromkeys(vals))


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'8192x8192,4096x14336' -> [(N, K), ...] (N x K, as in the tuning DB)."""
    out = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        parts = item.lower().replace("*", "x").split("x")
        try:
            n, k = (int(p, 0) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape {item!r}: expected NxK, e.g. 8192x8192") from None
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"shape {item!r}: N and K must be positive")
        out.append((n, k))
    if not out:
        raise argparse.ArgumentTypeError(f"expected NxK[,NxK...], got {text!r}")
    return list(dict.fromkeys(out))


def parse_names(text: str) -> List[str]:
    names = [v for v in text.replace(" ", "").split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return list(dict.fromkeys(names))


def _peer_names(text: str) -> List[str]:
    names = parse_names(text)
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(bad)} (known: {', '.join(PEERS)})")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `opgen bench` / `python -m opgen.bench`."""
    p.add_argument("--quick", action="store_true",
                   help=f"{'/'.join(f'{n}x{k}' for n, k in QUICK_SHAPES)}, M in "
                        f"{','.join(map(str, QUICK_MS))}, {len(QUICK_SPECS)} specs "
                        "(--specs/--shapes/--Ms still override)")
    p.add_argument("--specs", type=parse_names, default=None, metavar="A,B",
                   help="specs (shipped names or YAML files; default: every shipped matmul spec)")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="NxK,...",
                   help="weight shapes N x K (default: "
                        + ",".join(f"{n}x{k}" for n, k in DEFAULT_SHAPES) + ")")
    p.add_argument("--Ms", type=parse_ints, default=None, metavar="M,...",
                   help="token counts (default: " + ",".join(map(str, DEFAULT_MS)) + ")")
    p.add_argument("--peers", type=_peer_names, default=None, metavar="A,B",
                   help="peers to time (default: all of " + ",".join(PEERS) + "; "
                        f"{BASELINE} is always timed)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--budget-ms", type=float, default=DEFAULT_BUDGET_MS,
                   help=f"device time per measurement (default {DEFAULT_BUDGET_MS:g})")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="tuning DB (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--no-db", action="store_true", help="ignore the tuning DB: heuristic configs only")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking opgen's output rows against the numpy reference")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--workers", type=int, default=None,
                   help="compile processes (default: all cores)")
    p.add_argument("--mem-cap-gb", type=float, default=DEFAULT_MEM_CAP_GB,
                   help="memory for the rotating input copies of one problem")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(entry="opgen bench")


@dataclass(frozen=True)
class Plan:
    specs: Tuple[str, ...]          # as given (names or paths); None entries never
    shapes: Tuple[Tuple[int, int], ...]
    Ms: Tuple[int, ...]
    peers: Tuple[str, ...]


def resolve_plan(args: argparse.Namespace, shipped_matmul: Optional[Sequence[str]] = None) -> Plan:
    """The specs, shapes, Ms and peers to run: --quick's set, else the full
    defaults; an explicit --specs/--shapes/--Ms/--peers wins over both.
    shipped_matmul: the default spec list (asked of the shipped specs if None)."""
    if args.specs:
        specs = tuple(args.specs)
    elif args.quick:
        specs = QUICK_SPECS
    else:
        specs = tuple(shipped_matmul if shipped_matmul is not None else shipped_matmul_specs())
    shapes = tuple(args.shapes) if args.shapes else (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    Ms = tuple(sorted(args.Ms)) if args.Ms else (QUICK_MS if args.quick else DEFAULT_MS)
    peers = tuple(args.peers) if args.peers else PEERS
    if BASELINE not in peers:
        peers = (BASELINE,) + peers
    return Plan(specs, shapes, Ms, peers)


def shipped_matmul_specs() -> List[str]:
    from opgen.codegen.validate import load_spec, shipped_specs
    return [name for name, path in shipped_specs().items() if load_spec(path).op == "matmul"]


# --- floors ---------------------------------------------------------------------------

_STORE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1,
                "float8_e4m3": 1, "float8_e5m2": 1, "e8m0": 1, "int32": 4}


def storage_bytes(spec, N: int, K: int) -> Dict[str, int]:
    """Bytes of each stored weight tensor (qweight in its packed size, scales,
    zeros), as the kernels read them."""
    from opgen.codegen.spec import CONTAINER_BITS, scale_shape, weight_storage_shape, zero_shape
    w = spec.b
    rows, cols = weight_storage_shape(w, N, K)
    if w.pack is not None:
        elem = CONTAINER_BITS[w.pack.container] // 8
    else:   # unpacked: 16-bit floats 2 bytes, everything else one byte per code
        elem = _STORE_BYTES.get(w.dtype, 1)
    out = {"qweight": rows * cols * elem}
    if w.scale is not None:
        out["scales"] = math.prod(scale_shape(w.scale, N, K)) * _STORE_BYTES[w.scale.dtype]
    if w.zero.kind in ("float", "int"):
        z = w.zero
        if z.kind == "int":
            zb = CONTAINER_BITS[z.pack.container] // 8 if z.pack is not None else 1
        else:
            zb = _STORE_BYTES[z.dtype]
        out["zeros"] = math.prod(zero_shape(w, N, K)) * zb
    return out


def stored_shapes(spec, N: int, K: int) -> Dict[str, Tuple[int, ...]]:
    """Shapes of the stored weight tensors, as random_weight_tensors makes them."""
    from opgen.codegen.spec import scale_shape, weight_storage_shape, zero_shape
    w = spec.b
    out = {"qweight": tuple(weight_storage_shape(w, N, K))}
    if w.scale is not None:
        out["scales"] = tuple(scale_shape(w.scale, N, K))
    if w.zero.kind in ("float", "int"):
        out["zeros"] = tuple(zero_shape(w, N, K))
    return out


def bytes_moved(spec, M: int, N: int, K: int) -> int:
    """The least DRAM traffic of one call: every weight tensor once, the
    activation (and its per-row scales) once, the output once (and the bias)."""
    total = sum(storage_bytes(spec, N, K).values())
    total += M * K * _STORE_BYTES[spec.a.dtype]
    if spec.a.scale == "row":
        total += M * 4
    out_b = _STORE_BYTES[spec.out.dtype]
    total += M * N * out_b
    if spec.epilogue.bias:
        total += N * out_b
    return total


def matmul_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def peak_for(spec, measured: dict) -> Optional[float]:
    """The ceiling (TFLOP/s or TOP/s) of the MMA the spec's activations feed."""
    key = PEAK_FOR_ACT.get(spec.a.dtype, "fp16_tflops")
    val = measured.get(key)
    if not val and key == "fp8_tflops":        # same tensor-core rate as int8 on sm_89/sm_90
        val = measured.get("int8_tops")
    return val or None


def floors(spec, M: int, N: int, K: int, measured: dict) -> dict:
    """bytes, flops and the floors in microseconds: bytes / copy bandwidth
    (TB/s = 1e6 bytes/us), flops / ceiling (TFLOP/s = 1e6 flop/us), their max."""
    b, f = bytes_moved(spec, M, N, K), matmul_flops(M, N, K)
    bw, peak = measured.get("copy_tbps"), peak_for(spec, measured)
    b_us = b / (bw * 1e6) if bw else None
    f_us = f / (peak * 1e6) if peak else None
    have = [x for x in (b_us, f_us) if x is not None]
    floor = max(have) if have else None
    bound = None
    if floor is not None:
        bound = "memory" if (f_us is None or (b_us is not None and b_us >= f_us)) else "compute"
    return {"bytes": b, "flops": f, "bytes_floor_us": _r(b_us), "flops_floor_us": _r(f_us),
            "floor_us": _r(floor), "bound": bound}


def relevant_peer(spec) -> Optional[str]:
    """The peer a spec's users would otherwise call (None: only cuBLAS fp16)."""
    a, w = spec.a.dtype, spec.b
    if a == "int8":
        return "int_mm"
    if a == "float8_e4m3":
        return "scaled_mm"
    if w.dtype == "float16":
        return "cublas_fp16"
    if w.dtype == "bfloat16":
        return "cublas_bf16"
    if w.dtype in ("uint4", "int4"):
        return "tinygemm_int4"
    return None


def _r(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


def _ratio(num, den):
    if num is None or den is None or den <= 0:
        return None
    return num / den


def finish_row(row: dict, spec, measured: dict) -> dict:
    """Add the floors and the ratios to a row holding opgen_us and the peers' µs."""
    row.update(floors(spec, row["M"], row["N"], row["K"], measured))
    us = row.get("opgen_us")
    row["speedup_vs_cublas_fp16"] = _r(_ratio(row.get(f"{BASELINE}_us"), us))
    pct = _ratio(row.get("floor_us"), us)
    row["pct_of_floor"] = _r(None if pct is None else 100 * pct, 2)
    peer = relevant_peer(spec)
    row["relevant_peer"] = peer
    row["speedup_vs_peer"] = _r(_ratio(row.get(f"{peer}_us"), us)) if peer else None
    if "opgen_linear_us" in row or "opgen_linear_error" in row:
        # the fused linear from fp16 activations against the unfused BMINF pipeline (int8)
        row["linear_speedup_vs_bminf"] = (_r(_ratio(row.get("bminf_w8a8_us"), row.get("opgen_linear_us")))
                                          if spec.a.dtype == "int8" else None)
    return row


# --- targets --------------------------------------------------------------------------

TARGET_SHAPE = (8192, 8192)
W4_SPECS = ("gptq_v2_w4a16_g128", "w4a16_sym_g128")


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
            if ratio is None:
                status = "n/a"
            elif t.higher_is_better:
                status = "met" if ratio >= t.need else "missed"
            else:
                status = "met" if ratio <= t.need else "missed"
            e = {**base, "spec": r["spec"], "M": r["M"], "ratio": _r(ratio), "status": status}
            if why:
                e["why"] = why
            out.append(e)
    return out


# --- Markdown -------------------------------------------------------------------------

def _fmt_us(x) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 10000 else f"{x:.0f}"


def _fmt_x(x) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _fmt_pct(x) -> str:
    return "—" if x is None else f"{x:.0f}%"


def _table(headers: List[str], rows: List[List[str]], align: Optional[str] = None) -> str:
    align = align or "l" * len(headers)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(rows: Sequence[dict]) -> str:
    """The per-(spec, N, K, M) table."""
    headers = ["spec", "N x K", "M", "opgen µs", "config", "src", "cuBLAS fp16 µs", "speedup",
               "peer", "peer µs", "vs peer", "floor µs", "% floor", "check"]
    body = []
    for r in rows:
        peer = r.get("relevant_peer")
        if peer:
            pus = r.get(f"{peer}_us")
            peer_us = _fmt_us(pus) if pus is not None else (
                "err" if (r.get("peer_errors") or {}).get(peer) else "—")
        else:
            peer_us = "—"
        opgen = _fmt_us(r.get("opgen_us")) if r.get("opgen_us") is not None else (
            "err" if r.get("error") else "—")
        check = {True: "ok", False: "WRONG", None: "—"}[r.get("verified")]
        bound = {"memory": " (mem)", "compute": " (mma)"}.get(r.get("bound"), "")
        body.append([r["spec"], f"{r['N']}x{r['K']}", r["M"], opgen, r.get("config") or "—",
                     r.get("source") or "—", _fmt_us(r.get(f"{BASELINE}_us")),
                     _fmt_x(r.get("speedup_vs_cublas_fp16")),
                     PEER_LABELS.get(peer, "—") if peer and peer != BASELINE else "—",
                     peer_us if peer and peer != BASELINE else "—",
                     _fmt_x(r.get("speedup_vs_peer")) if peer and peer != BASELINE else "—",
                     _fmt_us(r.get("floor_us")) + bound, _fmt_pct(r.get("pct_of_floor")), check])
    return _table(headers, body, "lllrllrrlrrrrl")


def peers_table(peer_rows: Sequence[dict], peers: Sequence[str] = PEERS) -> str:
    headers = ["N x K", "M"] + [PEER_LABELS[p] + " µs" for p in peers]
    body = []
    for r in peer_rows:
        cells = []
        for p in peers:
            us = r.get(f"{p}_us")
            cells.append(_fmt_us(us) if us is not None else
                         ("err" if (r.get("errors") or {}).get(p) else "—"))
        body.append([f"{r['N']}x{r['K']}", r["M"], *cells])
    return _table(headers, body, "lr" + "r" * len(peers))


def linear_table(rows: Sequence[dict]) -> str:
    """opgen's fused linear (quantize + GEMM from fp16 activations) against the
    unfused BMINF W8A8 pipeline; "" when no row has one."""
    rows = [r for r in rows if "opgen_linear_us" in r or "opgen_linear_error" in r]
    if not rows:
        return ""
    body = []
    for r in rows:
        lu = r.get("opgen_linear_us")
        check = {True: "ok", False: "WRONG", None: "—"}[r.get("linear_verified")]
        body.append([r["spec"], f"{r['N']}x{r['K']}", r["M"],
                     _fmt_us(lu) if lu is not None else "err", _fmt_us(r.get("opgen_us")),
                     _fmt_us(r.get("bminf_w8a8_us")), _fmt_x(r.get("linear_speedup_vs_bminf")),
                     check])
    return _table(["spec", "N x K", "M", "opgen linear µs", "opgen GEMM µs", "BMINF W8A8 µs",
                   "vs BMINF", "check"], body, "llrrrrrl")


def targets_section(targets: Sequence[dict]) -> str:
    n_met = sum(t["status"] == "met" for t in targets)
    n_missed = sum(t["status"] == "missed" for t in targets)
    body = []
    for t in targets:
        if t["ratio"] is None:
            measured = "—"
        elif t["metric"] == "bytes_floor":
            measured = f"{t['ratio']:.2f}x floor"
        else:
            measured = f"{t['ratio']:.2f}x"
        status = t["status"] + (f" ({t['why']})" if t.get("why") and t["status"] != "met" else "")
        body.append([t["target"], t["spec"], "—" if t["M"] is None else t["M"], measured,
                     f"{t['op']} {t['need']:g}x", status])
    N, K = (targets[0]["N"], targets[0]["K"]) if targets else TARGET_SHAPE
    if all(t["status"] == "not measured" for t in targets):
        return (f"## Targets (N = {N}, K = {K})\n\nNot evaluated: this run has no row at "
                f"N = {N}, K = {K} for the target specs.")
    head = (f"## Targets (N = {N}, K = {K})\n\n{n_met} met, {n_missed} missed, "
            f"{len(targets) - n_met - n_missed} not measured / n/a.\n\n")
    return head + _table(["target", "spec", "M", "measured", "need", "status"], body, "llrrll")


def markdown(results: dict) -> str:
    env, meas = results.get("env", {}), results.get("measured", {})

    def num(k, unit, nd=1):
        v = meas.get(k)
        return f"{v:.{nd}f} {unit}" if v else "not measured"

    lines = [f"# opgen bench: {env.get('device', '?')}", ""]
    lines.append(f"`{results.get('command', '')}`")
    lines.append("")
    if results.get("complete") is False:
        lines += ["**Partial results: the run had not finished when this was written.**", ""]
    lines.append(f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), "
                 f"cupy {env.get('cupy', '?')}, NVRTC {env.get('nvrtc', '?')}, "
                 f"opgen {env.get('opgen', '?')}, {results.get('started_at', '')}")
    lines.append("")
    lines.append(f"Measured in this run: copy {num('copy_tbps', 'TB/s', 2)} (device-to-device, "
                 f"read + write), fp16 {num('fp16_tflops', 'TFLOP/s')}, "
                 f"int8 {num('int8_tops', 'TOP/s')}, fp8 {num('fp8_tflops', 'TFLOP/s')} "
                 "(cuBLAS at 8192^3).  Floor = max(bytes / copy bandwidth, flops / ceiling); "
                 "% floor = floor / opgen time.  All times are medians in µs.")
    lines.append("")
    lines.append("## Results")
    lines.append("")
    lines.append(results_table(results.get("rows", [])))
    lin = linear_table(results.get("rows", []))
    if lin:
        lines += ["", "## Fused linear from fp16 activations", "",
                  "opgen's quantize kernel + GEMM with both scales fused (`opgen.runtime.op."
                  "load_linear`), against the unfused BMINF pipeline (per-row quantize in torch "
                  "ops, `torch._int_mm`, scaling); the GEMM column is opgen on pre-quantized "
                  "activations.", "", lin]
    if results.get("peer_rows"):
        lines += ["", "## Peers", "", peers_table(results["peer_rows"],
                                                  results.get("peers") or PEERS)]
        errs = sorted({(p, e) for r in results["peer_rows"]
                       for p, e in (r.get("errors") or {}).items()})
        if errs:
            lines += ["", "Peer errors (first of each):", ""]
            seen = set()
            for p, e in errs:
                if p not in seen:
                    seen.add(p)
                    lines.append(f"- {PEER_LABELS.get(p, p)}: {e}")
    problems = []
    for r in results.get("rows", []):
        where = f"- {r['spec']} {r['N']}x{r['K']} M={r['M']}"
        if r.get("error"):
            problems.append(f"{where}: {r['error']}")
        elif r.get("verified") is False:
            problems.append(f"{where}: output check failed ({r.get('verify_msg', '')})")
        if r.get("opgen_linear_error"):
            problems.append(f"{where}, fused linear: {r['opgen_linear_error']}")
        elif r.get("linear_verified") is False:
            problems.append(f"{where}, fused linear: output check failed")
    if problems:
        lines += ["", "## Problems", ""] + problems
    if results.get("targets") is not None:
        lines += ["", targets_section(results["targets"])]
    return "\n".join(lines) + "\n"


# --- plots ----------------------------------------------------------------------------

def plot(results: dict, out_dir: Path) -> List[str]:
    """speedup.png (speedup over cuBLAS fp16 vs M) and floor.png (% of floor vs
    M), one subplot per shape, one line per spec.  [] (with a message) when
    matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("opgen bench: matplotlib not installed, no plots", file=sys.stderr)
        return []
    rows = [r for r in results.get("rows", []) if r.get("opgen_us") is not None]
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    if not shapes:
        return []
    written = []
    for fname, key, ylabel, ref in (
            ("speedup.png", "speedup_vs_cublas_fp16", "speedup over cuBLAS fp16 (x)", 1.0),
            ("floor.png", "pct_of_floor", "% of memory/compute floor", 100.0)):
        ncol = min(len(shapes), 3)
        nrow = -(-len(shapes) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(6.5 * ncol, 4.5 * nrow), squeeze=False)
        for ax, (N, K) in zip(axes.flat, shapes):
            specs = list(dict.fromkeys(r["spec"] for r in rows if (r["N"], r["K"]) == (N, K)))
            for s in specs:
                pts = sorted((r["M"], r[key]) for r in rows
                             if (r["N"], r["K"], r["spec"]) == (N, K, s) and r.get(key) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
            ax.axhline(ref, color="gray", linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            ms = sorted({r["M"] for r in rows if (r["N"], r["K"]) == (N, K)})
            ax.set_xticks(ms)
            ax.set_xticklabels([str(m) for m in ms])
            ax.minorticks_off()
            if key == "speedup_vs_cublas_fp16":
                ax.set_yscale("log", base=2)
            ax.set_title(f"N={N}, K={K}")
            ax.set_xlabel("M (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(shapes):]:
            ax.set_visible(False)
        fig.suptitle(f"opgen on {results.get('env', {}).get('device', '?')}")
        fig.tight_layout()
        path = Path(out_dir) / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def _json_default(x):
    item = getattr(x, "item", None)          # numpy scalars
    return item() if callable(item) else str(x)


def write_outputs(results: dict, out_dir, plots: bool = True) -> List[str]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    (out_dir / "bench.md").write_text(markdown(results))
    paths = [str(out_dir / "bench.json"), str(out_dir / "bench.md")]
    if plots:
        paths += plot(results, out_dir)
    return paths


# --- entry points ---------------------------------------------------------------------

def _load_specs(names: Sequence[str]):
    from opgen.codegen.errors import UserError
    from opgen.codegen.validate import load_spec, resolve_spec
    specs = []
    for arg in names:
        p = resolve_spec(arg)
        spec = load_spec(p, filename=arg if Path(arg).is_file() else str(p))
        if spec.op != "matmul":
            raise UserError(f"{arg}: op {spec.op!r} is not a matmul; opgen bench times matmuls")
        specs.append(spec)
    return specs


def _command_line(args) -> str:
    entry = getattr(args, "entry", "opgen bench")
    rest = sys.argv[1:]
    if entry == "opgen bench" and rest[:1] == ["bench"]:
        rest = rest[1:]
    return " ".join([entry, shlex.join(rest)]).strip()


def run(args: argparse.Namespace) -> int:
    """Run the benchmark (needs a CUDA GPU, torch and cupy)."""
    from opgen.codegen.errors import UserError
    t_start = time.time()
    plan = resolve_plan(args)
    specs = _load_specs(plan.specs)
    from opgen.codegen import planner
    for spec in specs:
        for N, K in plan.shapes:
            try:
                planner.check_shape(spec, N, K)
            except planner.PlanError as e:
                raise UserError(f"{spec.name} at N={N}, K={K}: {e}") from None
    g = _Gpu(budget_ms=args.budget_ms, mem_cap=int(args.mem_cap_gb * (1 << 30)), seed=args.seed)
    results = {
        "command": _command_line(args), "argv": list(sys.argv), "cwd": os.getcwd(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": g.env(),
        "plan": {"specs": [s.name for s in specs], "shapes": [list(s) for s in plan.shapes],
                 "Ms": list(plan.Ms), "peers": list(plan.peers)},
        "timing": {"budget_ms": args.budget_ms, "method": "CUDA events, launches queued behind a "
                   "spin kernel (runtime.tuner._Timer), median of samples, rotating input copies "
                   "(> 2x L2 in total)", "l2_bytes": g.l2},
        "peers": list(plan.peers),
    }
    db = None
    if not args.no_db:
        from opgen.runtime.tuning_db import TuningDB
        db = TuningDB(args.db)
        results["db"] = str(getattr(db, "path", args.db))
    g.log(f"{results['env'].get('device')}: {len(specs)} specs x {len(plan.shapes)} shapes x "
          f"{len(plan.Ms)} Ms")
    rows = results["rows"] = []
    peer_rows = results["peer_rows"] = []
    results["complete"] = False
    # compile in the background while the machine and the peers are timed
    pending = g.start_precompile(specs, plan.shapes, plan.Ms, db, not args.no_db, args.workers)
    try:
        results["measured"] = g.measure_machine()
        peers = {}
        for N, K in plan.shapes:
            peers[N, K] = g.time_peers(plan.peers, N, K, plan.Ms)
            peer_rows += [peers[N, K][M] for M in plan.Ms]
        write_outputs(results, args.out, plots=False)
        g.wait_precompile(pending)
    except BaseException:
        g.wait_precompile(pending, cancel=True)
        raise
    for N, K in plan.shapes:
        by_m = peers[N, K]
        for spec in specs:
            for r in g.time_spec(spec, N, K, plan.Ms, db=db, use_db=not args.no_db,
                                 verify=not args.no_verify):
                pr = by_m[r["M"]]
                for p in plan.peers:
                    r[f"{p}_us"] = pr.get(f"{p}_us")
                r["peer_errors"] = dict(pr.get("errors") or {})
                rows.append(finish_row(r, spec, results["measured"]))
            # keep the files current: a run cut short still leaves its rows behind
            results["targets"] = evaluate_targets(rows)
            results["wall_s"] = round(time.time() - t_start, 1)
            write_outputs(results, args.out, plots=False)
    results["complete"] = True
    results["targets"] = evaluate_targets(rows)
    results["wall_s"] = round(time.time() - t_start, 1)
    paths = write_outputs(results, args.out, plots=not args.no_plots)
    g.log(f"done: {len(rows)} rows in {results['wall_s']:.0f} s")
    print(results_table(rows))
    if any((r["N"], r["K"]) == TARGET_SHAPE for r in rows):
        print()
        print(targets_section(results["targets"]))
    print()
    for p in paths:
        print(p)
    failed = [r for r in rows if r.get("opgen_us") is None or r.get("verified") is False
              or r.get("linear_verified") is False]
    if failed:
        print(f"opgen bench: {len(failed)} row(s) failed or computed wrong results "
              "(see bench.md, Problems)", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m opgen.bench [options]` (the same as `opgen bench`)."""
    from opgen.codegen.errors import SpecErrors, UserError
    p = argparse.ArgumentParser(prog="python -m opgen.bench",
                                description="time opgen's kernels against the peers on this GPU")
    add_arguments(p)
    p.set_defaults(entry="python -m opgen.bench")
    args = p.parse_args(argv)
    try:
        return run(args)
    except SpecErrors as e:
        sys.stdout.flush()
        for err in e.errors:
            print(err, file=sys.stderr)
        return 2
    except UserError as e:
        sys.stdout.flush()
        print(f"opgen bench: error: {e}", file=sys.stderr)
        return 2


# --- the GPU side ---------------------------------------------------------------------

def _short(e: BaseException, n: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first[:n]


def _tile_shape_ok(small: Sequence[int], big: Sequence[int]) -> bool:
    return len(small) == len(big) and all(s > 0 and b % s == 0 for s, b in zip(small, big))


BASE_LIMIT = 2048


def base_shape(spec, N: int, K: int, limit: int = BASE_LIMIT) -> Tuple[int, int]:
    """(N0, K0) dividing (N, K), at most `limit` each, valid for the spec: the
    random reference weights are drawn at N0 x K0 and tiled up to N x K (data
    from numpy at 14336 x 57344 would take minutes; the kernels' speed does not
    depend on the values).  (N, K) itself when no such pair exists."""
    from opgen.codegen import planner
    N0, K0 = math.gcd(N, limit), math.gcd(K, limit)
    try:
        planner.check_shape(spec, N0, K0)
    except planner.PlanError:
        return N, K
    return N0, K0


class _Gpu:
    """torch + cupy on the current device, one _Timer for every measurement."""

    def __init__(self, budget_ms: float, mem_cap: int, seed: int = 0):
        from opgen.codegen.errors import UserError
        try:
            import torch
        except ImportError:
            raise UserError("opgen bench needs torch (with CUDA) for the peers") from None
        if not torch.cuda.is_available():
            raise UserError("opgen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        import cupy as cp
        from opgen.runtime import tuner
        self.torch, self.cp, self.tuner = torch, cp, tuner
        self.dev = torch.device("cuda", cp.cuda.runtime.getDevice())
        torch.cuda.set_device(self.dev)
        self.timer = tuner._Timer()
        self.tstream = torch.cuda.ExternalStream(self.timer.stream.ptr, device=self.dev)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self.l2 = int(props.get("l2CacheSize", 0)) or (60 << 20)
        self.budget_us = budget_ms * 1e3
        self.mem_cap = mem_cap
        self.seed = seed
        self.n_done = 0
        self.t0 = time.time()

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def env(self) -> dict:
        torch, cp = self.torch, self.cp
        from opgen import __version__
        from opgen.runtime import device
        out = {"device": device.device_name(), "arch": device.current_arch(),
               "sm_count": device.sm_count(), "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "cupy": cp.__version__, "opgen": __version__,
               "python": sys.version.split()[0], "l2_bytes": self.l2}
        for k, fn in (("nvrtc", device.nvrtc_version),
                      ("driver", lambda: cp.cuda.runtime.driverGetVersion()),
                      ("cuda_runtime", lambda: cp.cuda.runtime.runtimeGetVersion())):
            try:
                out[k] = fn()
            except Exception as e:     # informational only
                out[k] = f"unknown ({_short(e, 80)})"
        try:
            out["memory_bytes"] = int(torch.cuda.get_device_properties(self.dev).total_memory)
        except Exception:
            pass
        return out

    # -- timing
    def measure(self, launch):
        """Timing of launch(i) on the timer's stream (torch ops go there too)."""
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        with torch.cuda.stream(self.tstream):
            t = self.timer.measure(launch, budget_us=self.budget_us)
        return t

    def n_copies(self, per_copy: int) -> int:
        free, _ = self.cp.cuda.runtime.memGetInfo()
        return self.tuner._n_copies(per_copy, self.l2, min(self.mem_cap, free // 4))

    def free(self) -> None:
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.empty_cache()
        self.cp.get_default_memory_pool().free_all_blocks()

    # -- compile ahead, in parallel
    def _compile_jobs(self, specs, shapes, Ms, db, use_db: bool) -> list:
        """(spec, config, arch, N, K) of every kernel opgen.load will pick: the
        DB record of the bucket, else the planner's heuristic, as MatmulOp
        chooses.  A miss only means that kernel compiles later, serially."""
        from opgen.codegen import planner
        from opgen.runtime.buckets import bucket_of, representative_M
        from opgen.runtime.device import current_arch
        arch = current_arch()
        jobs = {}
        for spec in specs:
            for N, K in shapes:
                key = None
                if use_db and db is not None:
                    try:
                        from opgen.runtime.tuning_db import make_key
                        key = make_key(spec, N, K, arch=arch)
                    except Exception:
                        key = None
                for label in dict.fromkeys(bucket_of(M) for M in Ms):
                    cfg = None
                    if key is not None:
                        try:
                            rec = db.lookup(key, label)
                            if rec is not None:
                                cfg = planner.Config.from_dict(rec["config"])
                        except Exception:
                            cfg = None
                    if cfg is None:
                        try:
                            cfg = planner.heuristic(spec, arch, representative_M(label), N, K)
                        except Exception:
                            continue
                    jobs.setdefault((spec, cfg), (N, K))
            if spec.a.scale == "row":      # the quantize kernel of opgen's fused linear
                q = quantize_spec_for(spec)
                if q is not None:
                    jobs.setdefault((q, None), (0, 0))
        return [(spec, cfg, arch, N, K) for (spec, cfg), (N, K) in jobs.items()]

    def start_precompile(self, specs, shapes, Ms, db, use_db: bool, workers: Optional[int]):
        """Start compiling in worker processes (NVRTC is single-threaded CPU
        work) and return at once: the caller times the machine and the peers
        meanwhile, then calls wait_precompile.  One core is left to the timing
        loop.  Returns a handle (None when nothing is left to wait for)."""
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        jobs = self._compile_jobs(specs, shapes, Ms, db, use_db)
        if not jobs:
            return None
        fn = self.tuner._compile_one
        n_cpu = os.cpu_count() or 1
        workers = max(1, min(workers or max(1, n_cpu - 1), len(jobs)))
        self.log(f"compiling {len(jobs)} kernels ({workers} processes)")
        if workers == 1:
            failed = sum(fn(*job) is not None for job in jobs)
            self.log(f"compiled ({failed} failed; those rows will say why)")
            return None
        ex = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        return ex, [ex.submit(fn, *job) for job in jobs], time.time()

    def wait_precompile(self, handle, cancel: bool = False) -> None:
        if handle is None:
            return
        from concurrent.futures import as_completed
        ex, futs, t0 = handle
        if cancel:
            ex.shutdown(wait=False, cancel_futures=True)
            return
        failed = 0
        for f in as_completed(futs):
            try:
                failed += f.result() is not None
            except Exception:
                failed += 1
        ex.shutdown()
        self.log(f"compiled {len(futs)} kernels in {time.time() - t0:.1f} s "
                 f"({failed} failed; those rows will say why)")

    # -- the machine
    def measure_machine(self) -> dict:
        """Copy bandwidth (TB/s, bytes read + written) and the dense matmul
        ceilings at 8192^3 (TFLOP/s, TOP/s), each measured here; a failure is
        recorded as KEY_error and that ceiling left out."""
        out: dict = {}
        for key, fn in (("copy", self._copy_bandwidth), ("fp16", self._peak_fp16),
                        ("int8", self._peak_int8), ("fp8", self._peak_fp8)):
            try:
                out.update(fn())
            except Exception as e:
                out[f"{key}_error"] = _short(e)
            self.free()
        self.log("machine: " + ", ".join(f"{k}={v}" for k, v in out.items()))
        return out

    _COPY_BYTES = 1 << 30
    _PEAK_S = 8192

    def _copy_bandwidth(self) -> dict:
        """1 GiB device to device, as a memcpy and as an elementwise kernel; the faster."""
        torch, nbytes = self.torch, self._COPY_BYTES
        src = torch.empty(nbytes, dtype=torch.uint8, device=self.dev).random_(0, 255)
        dst = torch.empty_like(src)
        t_cp = self.measure(lambda i: dst.copy_(src)).median_us
        s32, d32 = src.view(torch.float32), dst.view(torch.float32)
        t_k = self.measure(lambda i: torch.neg(s32, out=d32)).median_us
        out = {"copy_bytes": 2 * nbytes, "copy_memcpy_tbps": round(2 * nbytes / t_cp / 1e6, 4),
               "copy_kernel_tbps": round(2 * nbytes / t_k / 1e6, 4)}
        out["copy_tbps"] = max(out["copy_memcpy_tbps"], out["copy_kernel_tbps"])
        return out

    def _peak_fp16(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        a = torch.randn(S, S, dtype=torch.float16, device=self.dev)
        b = torch.randn(S, S, dtype=torch.float16, device=self.dev)
        c = torch.empty(S, S, dtype=torch.float16, device=self.dev)
        t = self.measure(lambda i: torch.mm(a, b.t(), out=c)).median_us
        return {"fp16_tflops": round(2 * S ** 3 / t / 1e6, 2)}

    def _peak_int8(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        a = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=self.dev)
        b = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=self.dev)
        t = self.measure(lambda i: torch._int_mm(a, b.t())).median_us
        return {"int8_tops": round(2 * S ** 3 / t / 1e6, 2)}

    def _peak_fp8(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        f8 = torch.float8_e4m3fn
        a = torch.randn(S, S, dtype=torch.float16, device=self.dev).to(f8)
        b = torch.randn(S, S, dtype=torch.float16, device=self.dev).to(f8)
        sa = torch.ones(S, 1, dtype=torch.float32, device=self.dev)
        sb = torch.ones(1, S, dtype=torch.float32, device=self.dev)
        t = self.measure(lambda i: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                                    out_dtype=torch.bfloat16)).median_us
        return {"fp8_tflops": round(2 * S ** 3 / t / 1e6, 2)}

    # -- peers
    def _peer_defs(self, N: int, K: int):
        """name -> (make_weights() -> tuple, make_act(M) -> tuple, call(act, w))."""
        torch, dev = self.torch, self.dev
        f16, bf16, i8 = torch.float16, torch.bfloat16, torch.int8

        def randn(*shape, dtype):
            return torch.randn(*shape, dtype=torch.float16, device=dev).to(dtype)

        def randi8(*shape):
            return torch.randint(-127, 128, shape, dtype=i8, device=dev)

        def tinygemm_w():
            codes = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
            packed = torch._convert_weight_to_int4pack(codes, 8)
            sz = torch.randn(K // 128, N, 2, dtype=bf16, device=dev)
            return packed, sz

        def bminf(act, w):
            a, = act
            w8, ws = w
            s = a.abs().amax(dim=1, keepdim=True).float().clamp_(min=1e-8) / 127.0
            q = torch.round(a.float() / s).clamp_(-127, 127).to(i8)
            acc = torch._int_mm(q, w8.t())
            return (acc.float() * s * ws).to(f16)

        f8 = getattr(torch, "float8_e4m3fn", None)
        return {
            "cublas_fp16": (lambda: (randn(N, K, dtype=f16),),
                            lambda M: (randn(M, K, dtype=f16), torch.empty(M, N, dtype=f16, device=dev)),
                            lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
            "cublas_bf16": (lambda: (randn(N, K, dtype=bf16),),
                            lambda M: (randn(M, K, dtype=bf16), torch.empty(M, N, dtype=bf16, device=dev)),
                            lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
            "tinygemm_int4": (tinygemm_w,
                              lambda M: (randn(M, K, dtype=bf16),),
                              lambda act, w: torch._weight_int4pack_mm(act[0], w[0], 128, w[1])),
            "int_mm": (lambda: (randi8(N, K),),
                       lambda M: (randi8(M, K),),
                       lambda act, w: torch._int_mm(act[0], w[0].t())),
            "scaled_mm": (lambda: (randn(N, K, dtype=f8),
                                   torch.ones(1, N, dtype=torch.float32, device=dev)),
                          lambda M: (randn(M, K, dtype=f8),
                                     torch.ones(M, 1, dtype=torch.float32, device=dev)),
                          lambda act, w: torch._scaled_mm(act[0], w[0].t(), scale_a=act[1],
                                                          scale_b=w[1], out_dtype=bf16)),
            "bminf_w8a8": (lambda: (randi8(N, K),
                                    torch.rand(N, dtype=torch.float32, device=dev) / 64 + 1e-3),
                           lambda M: (randn(M, K, dtype=f16),),
                           bminf),
        }

    @staticmethod
    def _nbytes(ts) -> int:
        return sum(int(t.numel() * t.element_size()) for t in ts)

    def _rotating_time(self, make_w, make_act, call, Ms, on_result) -> None:
        """Time call(act_set, w_set) for each M, rotating weight and activation
        copies; on_result(M, us or None, error or None, n_copies)."""
        try:
            w0 = make_w()
        except Exception as e:
            for M in Ms:
                on_result(M, None, "weights: " + _short(e), 0)
            return
        w_sets = [w0]
        for M in Ms:
            try:
                act0 = make_act(M)
                n = self.n_copies(self._nbytes(w0) + self._nbytes(act0))
                while len(w_sets) < n:
                    w_sets.append(tuple(t.clone() for t in w0))
                acts = [act0] + [tuple(t.clone() for t in act0) for _ in range(n - 1)]
                call(acts[0], w_sets[0])              # raises here if unsupported
                self.torch.cuda.synchronize(self.dev)

                def launch(i, acts=acts, n=n):
                    call(acts[i % n], w_sets[i % n])
                t = self.measure(launch)
                on_result(M, t.median_us, None, n)
            except Exception as e:
                on_result(M, None, _short(e), 0)
            finally:
                launch = acts = act0 = None
        w_sets = w0 = None
        self.free()

    def time_peers(self, peers: Sequence[str], N: int, K: int, Ms: Sequence[int]) -> Dict[int, dict]:
        out = {M: {"N": N, "K": K, "M": M, "errors": {}} for M in Ms}
        defs = self._peer_defs(N, K)
        for name in peers:
            make_w, make_act, call = defs[name]

            def done(M, us, err, n, name=name):
                out[M][f"{name}_us"] = _r(us)
                if err:
                    out[M]["errors"][name] = err
                self.log(f"{N}x{K} M={M} {name}: " + (f"{us:.2f} us" if us is not None else err))
            self._rotating_time(make_w, make_act, call, Ms, done)
        return out

    # -- opgen
    def _to_torch(self, x):
        """numpy storage array -> torch CUDA tensor (bfloat16 bits -> bfloat16)."""
        import numpy as np
        torch = self.torch
        if x is None:
            return None
        x = np.ascontiguousarray(x)
        if x.dtype == np.uint16:
            return torch.from_numpy(x.view(np.int16)).to(self.dev).view(torch.bfloat16)
        return torch.from_numpy(x).to(self.dev)

    def _activation(self, spec, M0: int, K0: int, rng):
        """random_activation at M0 x K0, shared by the specs with the same
        activation type (fp8 quantization in numpy is slow)."""
        from opgen.codegen.reference import random_activation
        cache = self.__dict__.setdefault("_act_cache", {})
        key = (spec.a.dtype, spec.a.scale, M0, K0)
        if key not in cache:
            if len(cache) >= 16:
                cache.pop(next(iter(cache)))
            cache[key] = random_activation(spec, M0, K0, rng)
        return cache[key]

    def _tile(self, t, shape):
        if t is None:
            return None
        if tuple(t.shape) == tuple(shape):
            return t
        if not _tile_shape_ok(t.shape, shape):
            raise ValueError(f"cannot tile {tuple(t.shape)} to {tuple(shape)}")
        return t.repeat(*[b // s for s, b in zip(t.shape, shape)]).contiguous()

    def _first_and_time(self, call, act0, w_sets):
        """Rotating copies of act0 (its last item the output) and of the
        weights (w_sets, grown in place), then one launch on the timer's
        stream into a NaN-poisoned output (compiles/loads the kernel, and
        leaves act0's output for the check).  Returns (launch(i), copies)."""
        torch = self.torch
        per = self._nbytes(w_sets[0]) + self._nbytes([x for x in act0 if x is not None])
        n = self.n_copies(per)
        while len(w_sets) < n:
            w_sets.append(tuple(t.clone() for t in w_sets[0]))
        acts = [act0] + [tuple(None if x is None else x.clone() for x in act0) for _ in range(n - 1)]
        # the inputs were made on the default stream; the timer's stream is
        # non-blocking, so wait for them before the first launch
        torch.cuda.synchronize(self.dev)
        # compile/load + first launch, with torch's and cupy's current stream the
        # timer's (a kernel's split-K workspace is zeroed by cupy on first use)
        with torch.cuda.stream(self.tstream), self.timer.stream:
            act0[-1].fill_(float("nan"))
            call(act0, w_sets[0])
        torch.cuda.synchronize(self.dev)

        def launch(i):
            call(acts[i % n], w_sets[i % n])
        return launch, n

    def time_spec(self, spec, N: int, K: int, Ms: Sequence[int], db, use_db: bool,
                  verify: bool) -> List[dict]:
        """Rows for (spec, N, K, each M): opgen's matmul on quantized
        activations (opgen_us) and, for int8/fp8 activations, opgen's fused
        linear from fp16 activations (quantize + GEMM: opgen_linear_us)."""
        import numpy as np
        import opgen
        from opgen.codegen.reference import random_weight_tensors
        from opgen.runtime.buckets import bucket_of
        torch = self.torch
        rows = {M: {"spec": spec.name, "N": N, "K": K, "M": M, "opgen_us": None} for M in Ms}
        N0, K0 = base_shape(spec, N, K, getattr(self, "base_limit", BASE_LIMIT))
        rng = np.random.default_rng([self.seed, N, K, sum(map(ord, spec.name))])
        try:
            op = opgen.load(spec, N=N, K=K, db=db, use_db=use_db)
            host_w = random_weight_tensors(spec, N0, K0, rng)
            want = stored_shapes(spec, N, K)
            w0 = {k: self._tile(self._to_torch(v), want[k]) for k, v in host_w.items()}
            bias = host_bias = None
            if spec.epilogue.bias:
                host_bias = self.tuner._random_bias(spec, N0, rng)
                bias = self._tile(self._to_torch(host_bias), (N,))
        except Exception as e:
            for r in rows.values():
                r["error"] = "setup: " + _short(e)
            self.log(f"{spec.name} {N}x{K}: setup failed: {rows[Ms[0]]['error']}")
            return list(rows.values())
        lin = lin_error = None
        if spec.a.scale == "row":
            try:
                from opgen.runtime.op import load_linear
                lin = load_linear(spec, N, K, input_dtype="float16", db=db, use_db=use_db)
            except Exception as e:
                lin_error = _short(e)
        w_ref = None
        out_dt = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float32": torch.float32}[spec.out.dtype]
        names = list(w0)
        w_sets = [tuple(w0[k] for k in names)]

        def check(got_t, a_rows, s_rows, rows_idx):
            nonlocal w_ref
            if w_ref is None:
                w_ref = _reference_weight(spec, host_w, N0, K0)
            got = got_t[list(map(int, rows_idx))].float().cpu().numpy()
            return check_rows(spec, a_rows, s_rows, w_ref, host_bias, got, N, K, N0, K0)

        for M in Ms:
            r = rows[M]
            r["base_shape"] = [N0, K0]
            M0 = base_rows(M)
            rows_idx = check_rows_of(M)
            launch = None
            try:
                a_host, s_host = self._activation(spec, M0, K0, rng)
                a = self._tile(self._to_torch(a_host), (M, K))
                a_scale = self._tile(self._to_torch(s_host), (M,))
                out = torch.empty(M, N, dtype=out_dt, device=self.dev)

                def call(act, w):
                    t = dict(zip(names, w))
                    op(act[0], t["qweight"], t.get("scales"), t.get("zeros"), bias=bias,
                       a_scale=act[1], out=act[2])
                launch, n = self._first_and_time(call, (a, a_scale, out), w_sets)
                r["config"] = op.kernel_for(M).config.name
                r["bucket"] = bucket_of(M)
                r["source"] = op.sources.get(r["bucket"])
                if verify:
                    r.update(check(out, np.asarray(a_host)[rows_idx % M0],
                                   None if s_host is None else np.asarray(s_host)[rows_idx % M0],
                                   rows_idx))
                t = self.measure(launch)
                r["opgen_us"] = _r(t.median_us)
                r["samples"] = len(t.samples)
                r["copies"] = n
                self.log(f"{spec.name} {N}x{K} M={M}: {t.median_us:.2f} us "
                         f"({r['config']}, {r['source']})"
                         + ("" if r.get("verified") is not False else "  OUTPUT WRONG"))
            except Exception as e:
                r["error"] = _short(e)
                self.log(f"{spec.name} {N}x{K} M={M}: failed: {r['error']}")
            finally:
                launch = a = a_scale = out = None
            if lin_error is not None:
                r["opgen_linear_error"] = lin_error
            elif lin is not None:
                try:
                    from opgen.codegen.reference import quantize_activation
                    x_host = self.__dict__.setdefault("_x_cache", {}).get((M0, K0))
                    if x_host is None:
                        x_host = rng.standard_normal((M0, K0)).astype(np.float16)
                        self._x_cache[(M0, K0)] = x_host
                    x = self._tile(self._to_torch(x_host), (M, K))
                    out = torch.empty(M, N, dtype=out_dt, device=self.dev)

                    def lcall(act, w):
                        t = dict(zip(names, w))
                        lin(act[0], t["qweight"], t.get("scales"), t.get("zeros"), bias=bias,
                            out=act[1])
                    launch, _ = self._first_and_time(lcall, (x, out), w_sets)
                    if verify:
                        # each row quantized over K0 = over K: the tiled row has the same absmax
                        codes, sc = quantize_activation(spec, x_host[rows_idx % M0])
                        chk = check(out, codes, sc, rows_idx)
                        r["linear_verified"] = chk["verified"]
                        r["linear_rel_err"] = chk.get("rel_err")
                    t = self.measure(launch)
                    r["opgen_linear_us"] = _r(t.median_us)
                    self.log(f"{spec.name} {N}x{K} M={M}: linear (quantize + GEMM) "
                             f"{t.median_us:.2f} us"
                             + ("" if r.get("linear_verified") is not False else "  OUTPUT WRONG"))
                except Exception as e:
                    r["opgen_linear_error"] = _short(e)
                    self.log(f"{spec.name} {N}x{K} M={M}: linear failed: {r['opgen_linear_error']}")
                finally:
                    launch = x = out = None
        w_sets = w0 = None
        self.free()
        return [rows[M] for M in Ms]


def _reference_weight(spec, host_w, N0: int, K0: int):
    """The real weight [N0, K0] (float64) of the base tensors."""
    import numpy as np
    from opgen.codegen.reference import dequantize
    return np.asarray(dequantize(spec, host_w, N0, K0), dtype=np.float64)


def quantize_spec_for(spec, input_dtype: str = "float16"):
    """The op-quantize spec runtime.op.QuantizedLinearOp builds for `spec`
    (for compiling it ahead; None if that cannot be built here)."""
    try:
        from opgen.codegen.spec import Activation, Output, Spec
        return Spec(name=f"quantize_{spec.a.dtype}_{input_dtype}", op="quantize",
                    a=Activation(input_dtype), b=None, out=Output(spec.a.dtype))
    except Exception:
        return None


def base_rows(M: int, limit: int = 512) -> int:
    """M0: the activation rows drawn in numpy, tiled up to M (M itself up to
    `limit`, else `limit` when it divides M)."""
    return M if M <= limit or M % limit else limit


def check_rows_of(M: int):
    """The output rows checked: the first four, the middle one, the last."""
    import numpy as np
    return np.unique(np.array(list(range(min(M, 4))) + [M // 2, M - 1]))


def tile_to(x, shape):
    """numpy twin of the GPU side's torch .repeat tiling (for tests)."""
    import numpy as np
    if not _tile_shape_ok(x.shape, shape):
        raise ValueError(f"cannot tile {tuple(x.shape)} to {tuple(shape)}")
    return np.tile(x, [b // s for s, b in zip(x.shape, shape)])


def check_rows(spec, a_rows, s_rows, w_ref, host_bias, got, N, K, N0, K0) -> dict:
    """Compare output rows (got: their values, float) with the reference.
    The problem is the base problem tiled: a[m, k] = a0[m, k % K0],
    W[n, k] = W0[n % N0, k % K0], so out[m, n] = (K / K0) * (a0 @ W0^T)[m, n % N0]
    (+ bias, then the activation).  a_rows / s_rows: those rows of the base
    activation [., K0] and their scales; w_ref: the base weight, dequantized."""
    import numpy as np
    from opgen.codegen import reference
    from opgen.runtime.tuner import tolerance
    act = reference.activation_to_float(spec, np.asarray(a_rows),
                                        None if s_rows is None else np.asarray(s_rows))
    ref = (K // K0) * (act.astype(np.float64) @ w_ref.T)
    ref = np.tile(ref, (1, N // N0))
    if spec.epilogue.bias:
        b = reference._float_or_bf16_bits(host_bias).astype(np.float64)
        ref = ref + b[np.arange(N) % N0][None, :]
    if spec.epilogue.activation != "none":
        fn = getattr(reference, "_activation", None)
        if fn is None:
            return {"verified": None, "verify_msg": "activation epilogue not checked"}
        ref = fn(spec.epilogue.activation, ref)
    got = np.asarray(got, dtype=np.float64)
    tol = 2 * tolerance(spec)
    if not np.isfinite(got).all():
        return {"verified": False, "rel_err": None,
                "verify_msg": f"{int((~np.isfinite(got)).sum())} NaN/Inf in checked rows"}
    err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    ok = err <= tol
    res = {"verified": ok, "rel_err": float(f"{err:.3g}")}
    if not ok:
        res["verify_msg"] = f"relative error {err:.2e} > {tol:.1e}"
    return res


if __name__ == "__main__":
    sys.exit(main())
