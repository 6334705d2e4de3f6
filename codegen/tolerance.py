"""How far a kernel's output may be from the float32 reference: the one
tolerance policy, from the dtypes a kernel rounds through.  The tuner, `opgen
bench` and the GPU tests all hold kernels to it.

A kernel rounds in two places the reference need not: the MMA operands
(dequantized weights are rounded to the activation dtype, e.g. (q - z) * s to
fp16) and the output store (to out dtype).  Each rounding to a type of unit
roundoff u adds a relative error of RMS about u / sqrt(3) on random data
(independent errors over K add up like the signal does), so the expected
error is below 0.6 * (u_operand + u_out).  Allowing 2 * (u_operand + u_out)
(+ 1e-5 for float32 summation order) keeps a margin of more than 3x, yet
every real bug (a wrong scale, zero point, group, tile or unwritten output)
gives errors of order 0.1 to 1, far above it:
    fp16 in, fp16 out: 2.0e-3     bf16 in, bf16 out: 1.6e-2
    fp16 in, fp32 out: 1.0e-3     int8 in, fp16 out: 2.0e-3
    fp8 in, bf16 out: 8.8e-3     int8 in, int32 out: 0 (exact)
(fp32 out with fp16 inputs is not held to ~1e-4 because the reference may
keep the dequantized weights in float32 while the MMA needs fp16.)
8-bit activations with sub-byte weights are held to the same numbers as
their W8A8 twins (the rule reads only a.dtype and out.dtype): the products
of codes and q - z are exact, only the float32 scaling of the group sums
rounds, far inside fp16's roundoff allowed for the operands.  An int32 output
is the raw accumulator: integer sums are exact in any order, so the kernel
matches the reference bit for bit (tolerance 0).
"""
from __future__ import annotations

import numpy as np

from .spec import INT_OUT_DTYPES

# Unit roundoff (half an ulp, relative) of the types a kernel rounds through.
# 8-bit activations (int8, fp8 e4m3) are codes the kernel reads exactly: the
# products may be exact (int8 / fp8 MMA), but a kernel may as well convert the
# codes to fp16 (exact: every int8 and e4m3 value is an fp16) and dequantize the
# weights to fp16, so allow fp16's rounding. (Measured: fp8_e4m3_w8a8 at most
# 2.2e-3 against 8.8e-3 allowed, w8a8_int8 2.9e-4 against 2.0e-3.) fp8 wgmma
# keeps no full fp32 sum, so its error would grow with K (1.9e-2 at K = 57344);
# its kernels add each k-tile's sums up in fp32 (hw.Wgmma.exact_acc), which
# holds it to this bound at any K.
ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
            "int8": 2.0 ** -11, "float8_e4m3": 2.0 ** -11}

# `opgen bench` reports a row as wrong only past this many times the
# tolerance: its rows time what opgen.load picks (heuristic configs too, never
# held to the tolerance by the tuner), and the report is about speed, so it
# flags clear faults only.
BENCH_FACTOR = 2.0


# One output may be off by at most ELEMENT_FACTOR x tol x rms(ref) beyond its
# own rounding to the out dtype (2 u_out |ref|). Operand rounding gives each
# output an error of RMS about 0.3 tol x rms(ref) (above); its largest over
# 10^8 outputs stays near 6 sigma, ~2 tol x rms(ref) (a numpy emulation of
# every shipped spec's rounding, 64 x 1024 x 4096: at most 0.67). One wrong
# output (a tail column's scale, one element of a tile) hardly moves the
# Frobenius error of a large output (one typical output of 130 x 4104 zeroed:
# 0.7x tol, test_tolerance); this catches it unless |ref| there is under
# 8 tol x rms(ref) (fp16: 1.6 % of outputs).
ELEMENT_FACTOR = 8.0


def output_error(spec, got, ref) -> float:
    """The error a kernel's output is held to tolerance(spec) by: the larger
    of ||got - ref|| / ||ref|| (Frobenius) and the worst single output's error
    beyond its own rounding, over ELEMENT_FACTOR x rms(ref). got, ref: float64
    arrays of the same shape (an int32 output's as exact integers: any
    difference is an error, its tolerance 0)."""
    diff = got - ref
    norm = max(float(np.linalg.norm(ref)), 1e-30)
    err = float(np.linalg.norm(diff)) / norm
    if spec.out.dtype in INT_OUT_DTYPES or diff.size == 0:
        return err
    rms = norm / np.sqrt(diff.size)
    excess = np.abs(diff) - 2.0 * ROUNDOFF[spec.out.dtype] * np.abs(ref)
    return max(err, float(excess.max()) / (ELEMENT_FACTOR * rms))


def tolerance(spec) -> float:
    """Largest accepted output_error against the float32 reference (see the
    module docstring for why)."""
    if spec.out.dtype in INT_OUT_DTYPES:
        return 0.0          # exact integer sums: bit for bit
    u_in = ROUNDOFF.get(spec.a.dtype, ROUNDOFF["bfloat16"])
    u_out = ROUNDOFF[spec.out.dtype]
    return 2.0 * (u_in + u_out) + 1e-5
