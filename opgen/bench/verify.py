"""The tiled problem and its check: the random reference data is drawn at a
small base shape and tiled up to the full shape, so a few output rows can be
checked against numpy cheaply.  numpy only (no torch, no cupy)."""
from __future__ import annotations

import math
from typing import Sequence, Tuple

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


def base_rows(M: int, limit: int = 512) -> int:
    """M0: the activation rows drawn in numpy, tiled up to M (M itself up to
    `limit`, else `limit` when it divides M)."""
    return M if M <= limit or M % limit else limit


def check_rows_of(M: int):
    """The output rows checked: the first four, the middle one, the last."""
    import numpy as np
    return np.unique(np.array(list(range(min(M, 4))) + [M // 2, M - 1]))


def tile_to(x, shape, xp=None):
    """x repeated along every axis up to `shape`, with xp.tile (xp: numpy,
    the default, or cupy: the tuner tiles on the GPU; the bench's torch side
    does the same with .repeat)."""
    if xp is None:
        import numpy as xp
    if not _tile_shape_ok(x.shape, shape):
        raise ValueError(f"cannot tile {tuple(x.shape)} to {tuple(shape)}")
    return xp.tile(x, [b // s for s, b in zip(x.shape, shape)])


def _reference_weight(spec, host_w, N0: int, K0: int):
    """The real weight [N0, K0] (float64) of the base tensors."""
    import numpy as np
    from opgen.codegen.reference import dequantize
    return np.asarray(dequantize(spec, host_w, N0, K0), dtype=np.float64)


def check_rows(spec, a_rows, s_rows, w_ref, host_bias, got, N, K, N0, K0, tol=None) -> dict:
    """Compare output rows (got: their values, float) with the reference.
    The problem is the base problem tiled: a[m, k] = a0[m, k % K0],
    W[n, k] = W0[n % N0, k % K0], so out[m, n] = (K / K0) * (a0 @ W0^T)[m, n % N0]
    (+ bias, then the activation).  a_rows / s_rows: those rows of the base
    activation [., K0] and their scales; w_ref: the base weight, dequantized.
    tol: the largest relative error accepted (default: twice the tuner's
    tolerance(spec); the tuner passes tolerance(spec) itself)."""
    import numpy as np
    from opgen.codegen import reference
    from opgen.runtime.tuner import tolerance
    act = reference.activation_to_float(spec, np.asarray(a_rows),
                                        None if s_rows is None else np.asarray(s_rows))
    ref = (K // K0) * (act.astype(np.float64) @ w_ref.T)
    ref = np.tile(ref, (1, N // N0))
    if spec.epilogue.bias:
        b = reference.float_or_bf16_bits(host_bias).astype(np.float64)
        ref = ref + b[np.arange(N) % N0][None, :]
    ref = reference.apply_activation(spec.epilogue.activation, ref)
    got = np.asarray(got, dtype=np.float64)
    tol = 2 * tolerance(spec) if tol is None else tol
    if not np.isfinite(got).all():
        return {"verified": False, "rel_err": None,
                "verify_msg": f"{int((~np.isfinite(got)).sum())} NaN/Inf in checked rows"}
    err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    ok = err <= tol
    res = {"verified": ok, "rel_err": float(f"{err:.3g}")}
    if not ok:
        res["verify_msg"] = f"relative error {err:.2e} > {tol:.1e}"
    return res
