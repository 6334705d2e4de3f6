"""The reference semantics of a spec: numpy, slow, exact, and the oracle for
every GPU kernel test.

* A matmul computes out[M, N] = a[M, K] @ W^T with the logical weight W
  [N, K]; how its tensors are stored is storage.py's (raw codes, storage
  dtypes, the logical [R, G] form of scales and zeros).
* Dequantization runs in float32: "(q - z) * s" or "q * s - z".
* The matmul itself runs in float64, then bias, then the activation, then one
  rounding to float32 (`reference_matmul_f32`) and one to the out dtype
  (`reference_matmul`).  8-bit activation codes times integer weights
  (int32-accumulate specs; float8_e4m3 activations with integer or ternary
  codes) take the exact path: per scale group the exact sum of the codes'
  products a[m, k] * (q - z)[k, n], then * s[n, g] summed over groups, then
  * a_scale[m], all in float64 (`_exact_matmul`).
* out.dtype int32 (int8 activations, no scales) is that exact integer sum
  itself: `reference_matmul` returns it as np.int32, bit-exact; a sum beyond
  int32 is an error of the inputs (ValueError), never wrapped: every kernel's
  int32 accumulator, summing in any order with two's-complement wraparound,
  ends at the exact sum whenever that fits.
* Activations are quantized per row (`quantize_activation`: the op quantize
  kernels and int8 / fp8 matmul inputs); weights are quantized by quantize_weight.py.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from . import numerics as nx
from .spec import (A8_DTYPES, INT_OUT_DTYPES, Spec, Weight, codes_per_container, scale_shape,
                   weight_code, weight_storage_shape, zero_shape)
from .storage import (SpecLike, decode_storage, decode_zeros, expand, from_layout,
                      sign_extend, weight_of)

__all__ = [
    "code_values", "code_range", "n_raw_codes", "scale_logical", "zero_logical",
    "scales_nk", "zeros_nk", "dequantize", "float_or_bf16_bits", "quantize_activation",
    "activation_to_float", "apply_activation", "reference_matmul", "reference_matmul_f32",
]


# --- code values -------------------------------------------------------------------


def code_values(spec: SpecLike, raw: np.ndarray) -> np.ndarray:
    """The number each raw code stands for (float32, exact)."""
    w = weight_of(spec)
    code = weight_code(w)
    xp = nx.array_module(raw)
    raw = xp.asarray(raw, dtype=np.int64)
    if code.kind == "uint":
        return raw.astype(np.float32)
    if code.kind == "int":
        return sign_extend(raw, code.bits).astype(np.float32)
    if code.kind == "ternary":
        return (raw - 1).astype(np.float32)     # raw 3 is not a valid ternary code
    if code.kind == "table":
        return xp.asarray(np.asarray(code.table, dtype=np.float32))[raw]
    if w.dtype == "float16":
        return nx.f16_bits_to_f32(raw)
    return nx.from_storage(raw, w.dtype)        # bfloat16 bits, fp8 bits


def code_range(spec: SpecLike) -> Tuple[float, float]:
    """Smallest and largest value a code can stand for."""
    w = weight_of(spec)
    code = weight_code(w)
    if code.kind in ("uint", "int", "ternary"):
        return float(code.lo), float(code.hi)
    if code.kind == "table":
        return float(min(code.table)), float(max(code.table))
    m = nx.max_finite(w.dtype)
    return -m, m


def n_raw_codes(w: Weight) -> int:
    """How many raw codes are valid (random codes draw from 0 .. this - 1)."""
    code = weight_code(w)
    if code.kind == "ternary":
        return 3
    if code.kind == "table":
        return len(code.table)
    return 1 << code.bits


# --- scales and zero points per element --------------------------------------------


def scale_logical(w: Weight, tensors: dict, N: int, K: int, xp=np) -> np.ndarray:
    """The stored scales (shape checked) as float32 logical [R, G] (xp: the
    array module of the result when the spec stores none)."""
    if w.scale is None:
        return xp.ones((1, 1), np.float32)
    stored = nx.array_module(tensors["scales"]).asarray(tensors["scales"])
    want = scale_shape(w.scale, N, K)
    if stored.shape != want:
        raise ValueError(f"scales have shape {stored.shape}, expected {want}")
    return from_layout(w.scale, nx.from_storage(stored, w.scale.dtype), N, K)


def zero_logical(w: Weight, tensors: dict, N: int, K: int, xp=np) -> np.ndarray:
    """The zero points z (int zeros with their offset) as float32 logical [R, G]
    (xp: as scale_logical's)."""
    z = w.zero
    if z.kind == "none":
        return xp.zeros((1, 1), np.float32)
    if z.kind == "const":
        return xp.full((1, 1), z.value, np.float32)
    stored = nx.array_module(tensors["zeros"]).asarray(tensors["zeros"])
    want = zero_shape(w, N, K)
    if stored.shape != want:
        raise ValueError(f"zeros have shape {stored.shape}, expected {want}")
    if z.kind == "float":
        vals = nx.from_storage(stored, z.dtype)
    else:
        vals = (decode_zeros(w, stored) + np.int64(z.offset)).astype(np.float32)
    return from_layout(w.scale, vals, N, K)


def scales_nk(spec: SpecLike, tensors: dict, N: int, K: int, xp=np) -> np.ndarray:
    """The scale applying to each weight element, float32 [N, K] (1 without a
    scale; xp: as scale_logical's)."""
    return xp.array(expand(scale_logical(weight_of(spec), tensors, N, K, xp), N, K))


def zeros_nk(spec: SpecLike, tensors: dict, N: int, K: int, xp=np) -> np.ndarray:
    """The zero point z applying to each weight element, float32 [N, K]
    (int zeros already include the offset; xp: as scale_logical's)."""
    return xp.array(expand(zero_logical(weight_of(spec), tensors, N, K, xp), N, K))


# --- dequantize --------------------------------------------------------------------------


def _apply_formula(formula: str, q, s, z) -> np.ndarray:
    xp = nx.array_module(q)
    q, s, z = (xp.asarray(v, dtype=np.float32) for v in (q, s, z))
    if formula == "(q - z) * s":
        return (q - z) * s
    if formula == "q * s - z":
        return q * s - z
    raise ValueError(f"unknown formula {formula!r}")


def dequantize(spec: SpecLike, tensors: dict, N: int, K: int) -> np.ndarray:
    """Stored tensors -> the real weight W, float32 [N, K]: numpy arrays on
    the CPU, CuPy arrays on their GPU (the same values; no host copy)."""
    w = weight_of(spec)
    xp = nx.array_module(tensors["qweight"])
    qweight = xp.asarray(tensors["qweight"])
    want = weight_storage_shape(w, N, K)
    if qweight.shape != want:
        raise ValueError(f"qweight has shape {qweight.shape}, expected {want}")
    q = code_values(w, decode_storage(w, qweight))
    return _apply_formula(w.formula, q, scales_nk(w, tensors, N, K, xp), zeros_nk(w, tensors, N, K, xp))


# --- activations -----------------------------------------------------------------------


def float_or_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values of an array that is either real values (any float
    dtype) or bfloat16 bit patterns (np.uint16): the numpy dtype says which."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return nx.bf16_bits_to_f32(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"expected float values or bfloat16 bits (uint16), got {x.dtype}")
    return x.astype(np.float32)


def _quant_target(spec: Spec) -> str:
    return spec.out.dtype if spec.op == "quantize" else spec.a.dtype


def quantize_activation(spec: Spec, a: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric quantization of an activation [M, K].

    The target format is spec.a.dtype for matmul specs and spec.out.dtype for
    op "quantize" specs; the input is real values (float16/float32) or
    bfloat16 bits (np.uint16).
      int8:        a_scale = absmax / 127, codes = clip(rint(a / a_scale), -127, 127)
                   (np.int8; rint ties to even, -128 never produced)
      float8_e4m3: a_scale = absmax / 448, codes = e4m3(a / a_scale) RNE
                   saturating (np.uint8 bits)
    Both scale and division are float32 (a / a_scale, not a * (1 / a_scale)).
    A row of zeros gets a_scale = 1.0 (its codes are 0 either way, and 1 keeps
    kernels free of 0/0). Returns (codes, a_scale float32 [M]).
    """
    target = _quant_target(spec)
    x = float_or_bf16_bits(a)
    amax = np.abs(x).max(axis=-1)
    if target == "int8":
        qmax = np.float32(127.0)
    elif target == "float8_e4m3":
        qmax = np.float32(nx.FP8_E4M3_MAX)
    else:
        raise ValueError(f"cannot quantize activations to {target!r}")
    scale = (amax / qmax).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    t = x / scale[:, None]
    if target == "int8":
        codes = np.clip(np.rint(t), -127, 127).astype(np.int8)
    else:
        codes = nx.f32_to_fp8_e4m3(t)
    return codes, scale


def activation_to_float(spec: Spec, a: np.ndarray, a_scale: Optional[np.ndarray] = None) -> np.ndarray:
    """A stored activation (spec.a.dtype) -> real values float32 [M, K];
    int8 / fp8 codes are multiplied by the per-row a_scale (in float32).
    float16 / bfloat16 activations may also be given as real float values."""
    dt = spec.a.dtype
    a = np.asarray(a)
    if dt in ("float16", "bfloat16"):
        return float_or_bf16_bits(a)
    vals = a.astype(np.float32) if dt == "int8" else nx.fp8_e4m3_to_f32(a)
    if a_scale is None:
        if spec.a.scale == "row":
            raise ValueError(f"spec {spec.name!r}: {dt} activations need a_scale")
        return vals
    return vals * np.asarray(a_scale, dtype=np.float32).reshape(-1, 1)


# --- the matmul --------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def apply_activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    raise ValueError(f"unknown activation {name!r}")


# Integer weight codes: q - z is an integer the 8-bit product multiplies exactly.
_INT_CODES = ("uint", "int", "ternary")
# The activation codes' values are integer multiples of this (e4m3: its
# smallest subnormal, 2^-9), so float64 sums of their products with integers
# are exact below 2^53 of it.
_A8_UNIT = {"int8": 1.0, "float8_e4m3": 2.0 ** -9}


def _exact_path(spec: Spec) -> bool:
    """Whether spec's product is _exact_matmul's: int32 accumulation, or fp8
    activation codes times the integers q - z (every valid spec of fp8
    activations with integer weight codes; the others take the float path)."""
    w = spec.b
    return spec.accumulate == "int32" or (
        spec.a.dtype == "float8_e4m3" and weight_code(w).kind in _INT_CODES and _integer_qz(w))


def _integer_qz(w: Weight) -> bool:
    """Whether the weight is (q - z) * s with an integer z (without a zero
    point the two formulas are one)."""
    return w.zero.kind == "none" or (w.formula == "(q - z) * s" and w.zero.kind != "float")


def _exact_matmul(spec: Spec, a: np.ndarray, a_scale, tensors: dict, N: int, K: int) -> np.ndarray:
    """8-bit activation codes times integer weights: per scale group the
    exact sum of a_codes * (q - z), then * s[n, g], summed over groups, then
    * a_scale[m] (float64). Without scales the result is the exact sum itself."""
    w = spec.b
    code = weight_code(w)
    if spec.a.dtype not in A8_DTYPES or code.kind not in _INT_CODES:
        raise ValueError(f"spec {spec.name!r}: the exact product needs int8 / float8_e4m3 "
                         f"activations and integer weight codes")
    if not _integer_qz(w):
        raise ValueError(f"spec {spec.name!r}: the exact product needs formula "
                         f"'(q - z) * s' with an integer zero point")
    if spec.a.scale != "row" and a_scale is not None:
        raise ValueError(f"spec {spec.name!r}: its activations have no scale; pass no a_scale")
    if spec.a.scale == "row" and a_scale is None:
        raise ValueError(f"spec {spec.name!r}: {spec.a.dtype} activations need a_scale")
    q = code_values(w, decode_storage(w, tensors["qweight"])).astype(np.int64)
    z = zeros_nk(w, tensors, N, K).astype(np.int64)
    qz = q - z                                           # [N, K] integers
    s = scale_logical(w, tensors, N, K).astype(np.float64)   # [R, G]
    G = s.shape[1]
    L = K // G
    a = np.asarray(a)
    af = (a.astype(np.float64) if spec.a.dtype == "int8"
          else nx.fp8_e4m3_to_f32(a).astype(np.float64))          # the codes' exact values
    # Products summed in float64 (BLAS, fast) are exact while every partial
    # sum stays below 2**53 units; check the worst case rather than assume.
    bound = float(np.abs(af).max(initial=0)) * int(np.abs(qz).max(initial=0)) * L
    if not bound / _A8_UNIT[spec.a.dtype] < 2**53:
        raise ValueError("exact-product reference: group too long for exact float64 sums")
    qf = qz.astype(np.float64)
    acc = np.zeros((a.shape[0], N), np.float64)
    for g in range(G):
        part = af[:, g * L:(g + 1) * L] @ qf[:, g * L:(g + 1) * L].T    # exact
        acc += part * s[:, g][None, :]
    if a_scale is not None:
        acc *= np.asarray(a_scale, dtype=np.float32).astype(np.float64)[:, None]
    return acc


def reference_matmul_f32(spec: Spec, a: np.ndarray, tensors: dict,
                         a_scale: Optional[np.ndarray] = None,
                         bias: Optional[np.ndarray] = None,
                         w_real: Optional[np.ndarray] = None) -> np.ndarray:
    """act(a_real @ W^T + bias) computed in float64, rounded once to float32.

    a: stored activation [M, K] (see activation_to_float); tensors: stored
    weight tensors; bias: [N], required iff spec.epilogue.bias, in the out
    dtype's storage (float16 / bfloat16 bits as np.uint16 / float32) - or any
    float array of real values (the numpy dtype tells bits from values).
    w_real: dequantize(spec, tensors, N, K) when the caller already has it
    (it takes seconds at LLM sizes; tests reuse one weight for many checks).
    An int32 output: its exact value (reference_matmul), rounded to float32
    as a kernel's int32 output converted with astype(np.float32) is.
    """
    return _matmul64(spec, a, tensors, a_scale, bias, w_real).astype(np.float32)


def _matmul64(spec: Spec, a: np.ndarray, tensors: dict, a_scale, bias, w_real) -> np.ndarray:
    """act(a_real @ W^T + bias) in float64 (an int32 output: checked to be
    the exact int32 sum)."""
    if spec.op != "matmul":
        raise ValueError(f"spec {spec.name!r} is op {spec.op}, not a matmul")
    w = spec.b
    a = np.asarray(a)
    M, K = a.shape
    N = _infer_n(w, tensors["qweight"], K)
    if _exact_path(spec):
        acc = _exact_matmul(spec, a, a_scale, tensors, N, K)
    else:
        a_real = activation_to_float(spec, a, a_scale).astype(np.float64)
        W = dequantize(w, tensors, N, K) if w_real is None else w_real
        acc = a_real @ np.asarray(W, dtype=np.float64).T
    if spec.epilogue.bias:
        if bias is None:
            raise ValueError(f"spec {spec.name!r} has a bias: pass bias=")
        acc = acc + float_or_bf16_bits(bias).reshape(N).astype(np.float64)
    elif bias is not None:
        raise ValueError(f"spec {spec.name!r} has no bias in its epilogue")
    out = apply_activation(spec.epilogue.activation, acc)
    if spec.out.dtype in INT_OUT_DTYPES:
        _check_int32(spec, out)
    return out


def _check_int32(spec: Spec, out: np.ndarray) -> None:
    """An int32 output is the exact integer sum, and it must fit."""
    if not np.array_equal(out, np.rint(out)):
        raise ValueError(f"spec {spec.name!r}: an int32 output is an integer sum (no scales, "
                         f"no float epilogue)")
    lo, hi = float(out.min(initial=0)), float(out.max(initial=0))
    if lo < -2**31 or hi > 2**31 - 1:
        raise ValueError(f"spec {spec.name!r}: the int32 output overflows (sums {lo:.0f}.."
                         f"{hi:.0f}, int32 holds {-2**31}..{2**31 - 1})")


def reference_matmul(spec: Spec, a: np.ndarray, tensors: dict,
                     a_scale: Optional[np.ndarray] = None,
                     bias: Optional[np.ndarray] = None) -> np.ndarray:
    """The float32 reference cast (RNE) to the out dtype's storage:
    np.float16, bfloat16 bits as np.uint16, or np.float32; an int32 output
    is the exact integer sum, np.int32, bit-exact."""
    out = _matmul64(spec, a, tensors, a_scale, bias, None)
    if spec.out.dtype in INT_OUT_DTYPES:
        return out.astype(np.int32)
    return nx.to_storage(out.astype(np.float32), spec.out.dtype)


def _infer_n(w: Weight, qweight: np.ndarray, K: int) -> int:
    """N from the stored qweight's shape (layout and packing known)."""
    rows, cols = np.asarray(qweight).shape
    stored_n = rows if w.layout == "nt" else cols
    if w.pack is not None and w.pack.axis == "n":
        stored_n *= codes_per_container(w)
    return stored_n
