"""The tiled test problem and its check, numpy only.

Random data at the full shape would take minutes in numpy at 14336 x 57344,
and the kernels' speed does not depend on the values.  So the weights are
drawn at a small base shape N0 x K0 dividing N x K and tiled up, the
activations at M0 rows (tiled along K as well), and a few output rows are
checked against the numpy reference of the base problem, scaled: with
a[m, k] = a0[m, k % K0] and W[n, k] = W0[n % N0, k % K0],
out[m, n] = (K / K0) * (a0 @ W0^T)[m, n % N0] (+ bias, then the activation).

The workbench (workbench.py) moves these arrays to the GPU; the bench's CPU
tests use them as they are.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from ..codegen import planner, random_data, reference
from ..codegen.tolerance import output_error, tolerance

BASE_LIMIT = 2048            # largest N0, K0
ROW_LIMIT = 512              # largest M0


def tile_shape_ok(small: Sequence[int], big: Sequence[int]) -> bool:
    return len(small) == len(big) and all(s > 0 and b % s == 0 for s, b in zip(small, big))


def base_shape(spec, N: int, K: int, limit: int = BASE_LIMIT) -> Tuple[int, int]:
    """(N0, K0) dividing (N, K), at most `limit` each, valid for the spec;
    (N, K) itself when no such pair exists."""
    N0, K0 = math.gcd(N, limit), math.gcd(K, limit)
    try:
        planner.check_shape(spec, N0, K0)
    except planner.PlanError:
        return N, K
    return N0, K0


def base_rows(M: int, limit: int = ROW_LIMIT) -> int:
    """M0: the activation rows drawn in numpy, tiled up to M (M itself up to
    `limit`, else `limit` when it divides M)."""
    return M if M <= limit or M % limit else limit


def check_rows_of(M: int) -> np.ndarray:
    """The output rows checked: the first four, the middle one, the last."""
    return np.unique(np.array(list(range(min(M, 4))) + [M // 2, M - 1]))


def tile_to(x, shape, xp=np):
    """x repeated along every axis up to `shape`, with xp.tile (xp: numpy, or
    cupy to tile on the GPU)."""
    if not tile_shape_ok(x.shape, shape):
        raise ValueError(f"cannot tile {tuple(x.shape)} to {tuple(shape)}")
    return xp.tile(x, [b // s for s, b in zip(x.shape, shape)])


def reference_weight(spec, host_w, N0: int, K0: int) -> np.ndarray:
    """The real weight [N0, K0] (float64) of the base tensors."""
    return np.asarray(reference.dequantize(spec, host_w, N0, K0), dtype=np.float64)


def check_rows(spec, a_rows, s_rows, w_ref, host_bias, got, N, K, N0, K0, tol=None) -> dict:
    """Compare output rows (got: their values, float) with the reference of
    the tiled problem.  a_rows / s_rows: those rows of the base activation
    [., K0] and their scales; w_ref: the base weight, dequantized.  tol: the
    largest error accepted (tolerance.output_error; default tolerance(spec)).
    Returns {"verified", "rel_err" (that error; None if not finite), "verify_msg" if not}."""
    act = reference.activation_to_float(spec, np.asarray(a_rows),
                                        None if s_rows is None else np.asarray(s_rows))
    ref = (K // K0) * (act.astype(np.float64) @ w_ref.T)
    ref = np.tile(ref, (1, N // N0))
    if spec.epilogue.bias:
        b = reference.float_or_bf16_bits(host_bias).astype(np.float64)
        ref = ref + b[np.arange(N) % N0][None, :]
    ref = reference.apply_activation(spec.epilogue.activation, ref)
    got = np.asarray(got, dtype=np.float64)
    tol = tolerance(spec) if tol is None else tol
    if not np.isfinite(got).all():
        return {"verified": False, "rel_err": None,
                "verify_msg": f"{int((~np.isfinite(got)).sum())} NaN/Inf in checked rows"}
    err = output_error(spec, got, ref)
    ok = err <= tol
    res = {"verified": ok, "rel_err": float(f"{err:.3g}")}
    if not ok:
        res["verify_msg"] = f"error {err:.2e} > {tol:.1e} (tolerance.output_error)"
    return res


# --- the random base data -----------------------------------------------------------

@dataclass(frozen=True)
class BaseWeights:
    """The random weights of a spec at a base shape N0 x K0 (host), their bias
    and their dequantized real values (for the check)."""
    tensors: dict
    bias: Optional[np.ndarray]
    real: np.ndarray


@functools.lru_cache(maxsize=2)
def base_weights(spec, N0: int, K0: int, seed: int) -> BaseWeights:
    """Drawn once per spec and base shape (the bench shapes all share 2048 x
    2048), so every shape and bucket of a spec reuses them."""
    rng = np.random.default_rng([seed, N0, K0])
    tensors = dict(random_data.random_weight_tensors(spec, N0, K0, rng))
    bias = random_data.random_bias(spec, N0, rng) if spec.epilogue.bias else None
    return BaseWeights(tensors, bias, reference_weight(spec, tensors, N0, K0))


@dataclass(frozen=True)
class BaseActivation:
    """An activation at M0 x K0: what the kernel is given (`input`, with its
    row scales or None) and what the reference computes with (`a`, `a_scale`:
    the same, or for a float input the codes it quantizes to)."""
    input: np.ndarray
    input_scale: Optional[np.ndarray]
    a: np.ndarray
    a_scale: Optional[np.ndarray]


@functools.lru_cache(maxsize=16)
def base_activation(spec, M0: int, K0: int, seed: int,
                    input_dtype: Optional[str] = None) -> BaseActivation:
    """N(0, 1) values at M0 x K0 in spec.a's storage; with input_dtype (e.g.
    "float16") in that float type instead, for a linear that quantizes its
    input itself (runtime.op.QuantizedLinearOp): each row is quantized over K0
    exactly as over K, since the tiled row has the same absmax."""
    rng = np.random.default_rng([seed, 1, M0, K0])
    if input_dtype is None:
        a, s = random_data.random_activation(spec, M0, K0, rng)
        return BaseActivation(a, s, a, s)
    x = rng.standard_normal((M0, K0)).astype(input_dtype)
    codes, scale = reference.quantize_activation(spec, x)
    return BaseActivation(x, None, codes, scale)


# --- outputs --------------------------------------------------------------------------

def out_dtype(spec):
    """The numpy dtype an output is stored in (bfloat16 as its bits: neither
    numpy nor cupy has it)."""
    return {"float16": np.float16, "float32": np.float32, "bfloat16": np.uint16,
            "int32": np.int32}[spec.out.dtype]


# An int32 output's poison: the one int32 no exact sum reaches on random data
# (reference.py refuses sums beyond int32; random codes stay far inside).
INT32_POISON = np.iinfo(np.int32).min


def poison(spec):
    """A NaN in the output's storage (int32: INT32_POISON), written everywhere
    before a launch."""
    return {"bfloat16": 0x7FC0, "int32": INT32_POISON}.get(spec.out.dtype, np.nan)


def out_to_f32(spec, host: np.ndarray) -> np.ndarray:
    """float32 values of an output (int32: float64, which holds every int32
    exactly, where float32 would round sums past 2^24; the poison a NaN)."""
    if spec.out.dtype == "bfloat16":
        return (host.astype(np.uint32) << 16).view(np.float32)
    if spec.out.dtype == "int32":
        return np.where(host == INT32_POISON, np.nan, host.astype(np.float64))
    return host.astype(np.float32)


def nonfinite(spec, out, xp=np) -> int:
    """How many elements of an output are NaN/Inf (bfloat16: by its bits;
    int32: the poison left)."""
    if spec.out.dtype == "bfloat16":
        return int(((out & 0x7F80) == 0x7F80).sum())
    if spec.out.dtype == "int32":
        return int((out == INT32_POISON).sum())
    return int((~xp.isfinite(out)).sum())
