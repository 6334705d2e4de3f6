"""What a matmul must cost at least: the bytes one call moves, its flops, the
machine's ceilings (peaks) they are divided by, the resulting floors, and the
ratios each result row gets (speedups, % of floor).  Pure Python."""
from __future__ import annotations

import math
from typing import Dict, Optional

from ..codegen.spec import CONTAINER_BITS, stored_shapes
from .plan import BASELINE

# Ceilings measured at start-up (machine.measure_machine); keys of "measured".
PEAK_FOR_ACT = {"float16": "fp16_tflops", "bfloat16": "fp16_tflops", "int8": "int8_tops",
                "float8_e4m3": "fp8_tflops"}


_STORE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1,
                "float8_e4m3": 1, "float8_e5m2": 1, "e8m0": 1, "int32": 4}


def storage_bytes(spec, N: int, K: int) -> Dict[str, int]:
    """Bytes of each stored weight tensor (qweight in its packed size, scales,
    zeros), as the kernels read them."""
    w = spec.b
    shapes = stored_shapes(spec, N, K)
    if w.pack is not None:
        elem = CONTAINER_BITS[w.pack.container] // 8
    else:   # unpacked: 16-bit floats 2 bytes, everything else one byte per code
        elem = _STORE_BYTES.get(w.dtype, 1)
    out = {"qweight": math.prod(shapes["qweight"]) * elem}
    if "scales" in shapes:
        out["scales"] = math.prod(shapes["scales"]) * _STORE_BYTES[w.scale.dtype]
    if "zeros" in shapes:
        z = w.zero
        if z.kind == "int":
            zb = CONTAINER_BITS[z.pack.container] // 8 if z.pack is not None else 1
        else:
            zb = _STORE_BYTES[z.dtype]
        out["zeros"] = math.prod(shapes["zeros"]) * zb
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
    if "opgen_graph_us" in row:
        # graph mode, per layer: against the byte floor (the graph targets)
        # and against the isolated launch
        g = row["opgen_graph_us"]
        row["graph_x_bytes_floor"] = _r(_ratio(g, row.get("bytes_floor_us")))
        row["graph_x_isolated"] = _r(_ratio(g, us))
    if "opgen_linear_us" in row or "opgen_linear_error" in row:
        # the fused linear from fp16 activations against the unfused BMINF pipeline (int8)
        row["linear_speedup_vs_bminf"] = (_r(_ratio(row.get("bminf_w8a8_us"), row.get("opgen_linear_us")))
                                          if spec.a.dtype == "int8" else None)
    return row


# Memory-bound rows up to this M also get the time of a kernel that only
# reads their bytes (machine.ReadTimes): the floor as this timer sees it.
READ_ONLY_MAX_M = 16


def add_read_only(row: dict, read_us) -> dict:
    row["read_us"] = _r(read_us)
    row["x_read"] = _r(_ratio(row.get("opgen_us"), read_us))
    return row
