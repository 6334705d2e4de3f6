"""Random valid inputs for a spec, as the kernels take them: weight tensors
(random codes, scales and zero points), activations and biases.  What the
tuner, the bench and the tests feed the kernels and the reference.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from . import numerics as nx
from .quantize_weight import store_scale, values_to_raw
from .reference import code_range, dequantize, n_raw_codes, quantize_activation
from .spec import WEIGHT_CODES, Spec, Weight, weight_code
from .storage import (QuantizedWeight, SpecLike, checked_n_groups, encode_codes,
                      encode_zeros, to_layout, weight_of)

__all__ = ["random_codes", "random_weight_tensors", "random_activation", "random_bias"]


def random_codes(spec: SpecLike, N: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random valid raw codes [N, K] (int64) over the whole code
    range: every int/uint/table code, ternary 0..2, fp8 every *finite* bit
    pattern. float16 / bfloat16 weights get the bits of N(0, 1/K) values
    instead (their full range would overflow any output)."""
    w = weight_of(spec)
    code = weight_code(w)
    if code.kind == "float":
        if w.dtype in ("float16", "bfloat16"):
            vals = rng.standard_normal((N, K)).astype(np.float32) / np.float32(math.sqrt(K))
            return values_to_raw(w, vals)
        finite = np.flatnonzero(np.isfinite(nx.from_storage(np.arange(256), w.dtype)))
        return rng.choice(finite, size=(N, K)).astype(np.int64)
    n = n_raw_codes(w)
    # drawn as bytes when they fit (several times faster at LLM sizes)
    return rng.integers(0, n, size=(N, K), dtype=np.uint8 if n <= 256 else np.int64).astype(np.int64)


def _random_zero(w: Weight, s_eff: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random stored zeros (kinds float and int) for logical scales s_eff [R, G]."""
    z = w.zero
    lo, hi = code_range(w)
    if z.kind == "int":
        # stored codes whose zero point (stored + offset) lies in the code
        # range, as real zero points do (or the storable ones nearest to it)
        zc = WEIGHT_CODES[z.dtype]
        s_lo, s_hi = sorted(int(np.clip(v - z.offset, zc.lo, zc.hi))
                            for v in (math.ceil(lo), math.floor(hi)))
        stored = rng.integers(s_lo, s_hi + 1, size=s_eff.shape, dtype=np.int64)
        return encode_zeros(w, to_layout(w.scale, stored))
    z_codes = rng.uniform(lo, hi, size=s_eff.shape)            # in code units
    z_real = z_codes if w.formula == "(q - z) * s" else z_codes * s_eff
    return nx.to_storage(to_layout(w.scale, z_real), z.dtype)


def random_weight_tensors(spec: SpecLike, N: int, K: int,
                          rng: np.random.Generator) -> QuantizedWeight:
    """Random valid stored tensors: random codes, positive scales around
    1 / (max|code value| * sqrt(K)) (times U(0.5, 1.5); e8m0: the nearest power
    of two times 2**{-1,0,1}) so that out = a @ W^T stays O(1) for N(0,1)
    activations, and random zeros anywhere in the code range (int: stored
    codes whose zero point stored + offset is a code value). Never
    dequantizes to all zeros."""
    w = weight_of(spec)
    checked_n_groups(w.scale, K)
    for _ in range(100):
        out = QuantizedWeight()
        out["qweight"] = encode_codes(w, random_codes(w, N, K, rng))
        if w.scale is not None:
            lo, hi = code_range(w)
            unit = 1.0 / (max(abs(lo), abs(hi), 1.0) * math.sqrt(K))
            rows = 1 if w.scale.granularity == "tensor" else N
            shape = (rows, checked_n_groups(w.scale, K))
            if w.scale.dtype == "e8m0":
                e = round(math.log2(unit)) + rng.integers(-1, 2, size=shape)
                s_ideal = np.ldexp(1.0, e)
            elif w.dtype in ("float16", "bfloat16"):
                s_ideal = rng.uniform(0.5, 1.5, size=shape)
            else:
                s_ideal = unit * rng.uniform(0.5, 1.5, size=shape)
            out["scales"], s_eff = store_scale(w, s_ideal)
            if w.zero.kind in ("int", "float"):
                out["zeros"] = _random_zero(w, s_eff, rng)
        if np.any(dequantize(w, out, N, K) != 0):
            return out
    raise RuntimeError("could not draw a non-zero random weight")  # pragma: no cover


def random_activation(spec: Spec, M: int, K: int,
                      rng: np.random.Generator) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Random activation in spec.a.dtype's storage: N(0, 1) values, cast
    (float16 / bfloat16 bits) or quantized per row with quantize_activation
    (int8 / float8_e4m3, returning their a_scale; an int32-output spec has no
    activation scale: its codes alone, full-range rows). For op "quantize"
    specs this is the float input. Returns (a, a_scale or None)."""
    x = rng.standard_normal((M, K)).astype(np.float32)
    dt = spec.a.dtype
    if dt == "float16":
        return x.astype(np.float16), None
    if dt == "bfloat16":
        return nx.f32_to_bf16_bits(x), None
    if spec.op == "quantize":
        raise ValueError(f"op quantize input dtype {dt!r} must be float16 or bfloat16")
    codes, scale = quantize_activation(spec, x)
    return codes, (scale if spec.a.scale == "row" else None)


def random_bias(spec: Spec, N: int, rng: np.random.Generator) -> np.ndarray:
    """Random bias[N] in the storage the kernels take for spec.out.dtype
    (float16, float32, bfloat16 as uint16 bits), with values k/8 in [-2, 2]
    that every output dtype holds exactly."""
    return nx.to_storage(rng.integers(-16, 17, size=N).astype(np.float32) / 8, spec.out.dtype)
