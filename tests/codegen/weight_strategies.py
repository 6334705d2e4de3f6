"""Hypothesis strategies for weight formats, shared by the tests of the
numpy reference (test_storage, test_quantize_weight, test_random_data,
test_reference): every weight dtype, container, pack axis, field order,
layout, scale granularity/dtype/layout, zero kind and formula that the
validator accepts, built directly from the dataclasses.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck
from hypothesis import strategies as st

from opgen.codegen.reference import code_range
from opgen.codegen.spec import (CONTAINER_BITS, INT_ZERO_DTYPES, WEIGHT_CODES,
                                WEIGHT_DTYPES, Pack, Scale, Weight, Zero, weight_code)

# OPGEN_HYPOTHESIS_EXAMPLES=5000 for a long randomized soak instead of the
# fast deterministic default
_SOAK = int(os.environ.get("OPGEN_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = dict(deadline=None, max_examples=_SOAK or 150, derandomize=not _SOAK,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FLOAT16_DTYPES = ("float16", "bfloat16")
FP8_DTYPES = ("float8_e4m3", "float8_e5m2")


# --- spec generation -------------------------------------------------------------------


def _lcm(*xs: int) -> int:
    out = 1
    for x in xs:
        out = out * x // math.gcd(out, x)
    return out


@st.composite
def _pack(draw, bits: int) -> Pack:
    container = draw(st.sampled_from(("uint8", "int32")))
    P = CONTAINER_BITS[container] // bits
    order = tuple(draw(st.permutations(range(P))))
    return Pack(container, draw(st.sampled_from(("k", "n"))), order, draw(st.booleans()))


@st.composite
def weights(draw):
    """(Weight, N, K) for a random valid weight spec and a compatible shape."""
    dtype = draw(st.sampled_from(WEIGHT_DTYPES))
    codebook, cbits = None, None
    if dtype == "codebook":
        cbits = draw(st.sampled_from((1, 2, 4, 8)))
        n_entries = draw(st.integers(2, 1 << cbits))
        # entries on a 1/64 grid in [-4, 4]: realistic magnitudes (a table
        # whose largest entry is 1e-45 needs scales no dtype holds)
        vals = draw(st.lists(st.integers(-256, 256).map(lambda i: i / 64), min_size=n_entries,
                             max_size=n_entries, unique=True))
        if not any(vals):
            vals[0] = 1.0
        codebook = tuple(sorted(vals)) if draw(st.booleans()) else tuple(vals)
    bits = cbits or WEIGHT_CODES[dtype].bits
    pack = draw(_pack(bits)) if bits < 8 else None
    P = CONTAINER_BITS[pack.container] // bits if pack else 1

    scale = None
    scale_choice = draw(st.sampled_from(
        ("none", "channel", "tensor") if dtype in FLOAT16_DTYPES
        else ("none", "group", "group", "channel", "tensor")))
    if scale_choice != "none":
        sdtypes = ("float16", "bfloat16", "float32") + (("e8m0",) if scale_choice == "group" else ())
        G = None
        if scale_choice == "group":
            G = draw(st.sampled_from([g for g in (16, 32, 64) if not (pack and pack.axis == "k" and g % P)]
                                     or [P]))
        scale = Scale(draw(st.sampled_from(sdtypes)), scale_choice, G,
                      draw(st.sampled_from(("kn", "nk"))))

    zero = Zero()
    if scale is not None and dtype not in FLOAT16_DTYPES + FP8_DTYPES:
        kind = draw(st.sampled_from(("none", "const", "float", "int")))
        if kind == "const":
            # a zero point that is a code value, so that 0 is representable
            lo, hi = code_range(Weight(dtype, codebook=codebook, bits=cbits))
            if math.ceil(lo) <= math.floor(hi):
                zero = Zero("const", value=draw(st.integers(math.ceil(lo), math.floor(hi))))
        elif kind == "float":
            zero = Zero("float", draw(st.sampled_from(("float16", "bfloat16", "float32"))))
        elif kind == "int":
            zdt = draw(st.sampled_from(INT_ZERO_DTYPES))
            zbits = WEIGHT_CODES[zdt].bits
            if scale.granularity == "tensor" and zbits < 8:
                zdt = draw(st.sampled_from(("uint8", "int8")))
                zbits = 8
            zpack = draw(_pack(zbits)) if zbits < 8 else None
            if zpack is not None and scale.granularity == "channel":
                zpack = Pack(zpack.container, "n", zpack.order, zpack.planes)
            zero = Zero("int", zdt, zpack, offset=draw(st.integers(0, 1)))
    w = Weight(dtype, draw(st.sampled_from(("nt", "nn"))), pack, scale, zero,
               draw(st.sampled_from(("(q - z) * s", "q * s - z"))), codebook, cbits)

    # the smallest shape the packing and grouping allow, times 1 or 2
    n_min, k_min = min_shape(w)
    return w, n_min * draw(st.integers(1, 2)), k_min * draw(st.integers(1, 2))


def min_shape(*ws: Weight):
    """The smallest (N, K) that every weight's packing and grouping allow
    (at least 8 x 16)."""
    n_req, k_req = [8], [16]
    for w in ws:
        pack, scale, zero = w.pack, w.scale, w.zero
        if pack:
            P = CONTAINER_BITS[pack.container] // weight_code(w).bits
            (k_req if pack.axis == "k" else n_req).append(P)
        if scale and scale.granularity == "group":
            k_req.append(scale.group)
        if zero.kind == "int" and zero.pack:
            Pz = CONTAINER_BITS[zero.pack.container] // WEIGHT_CODES[zero.dtype].bits
            if zero.pack.axis == "n":
                n_req.append(Pz)
            else:
                k_req.append(scale.group * Pz)
    return _lcm(*n_req), _lcm(*k_req)


@st.composite
def restored(draw, w: Weight) -> Weight:
    """w stored another way: layout, packing, scale layout and zero packing
    drawn anew, the meaning (codes, scales, zero points) kept."""
    bits = weight_code(w).bits
    pack = draw(_pack(bits)) if w.pack is not None else None
    if pack is not None and w.scale is not None and w.scale.granularity == "group" \
            and pack.axis == "k" and w.scale.group % (CONTAINER_BITS[pack.container] // bits):
        pack = Pack("uint8", pack.axis, tuple(draw(st.permutations(range(8 // bits)))))
    scale = w.scale and replace(w.scale, layout=draw(st.sampled_from(("kn", "nk"))))
    zero = w.zero
    if zero.pack is not None:
        zpack = draw(_pack(WEIGHT_CODES[zero.dtype].bits))
        if scale.granularity == "channel":
            zpack = Pack(zpack.container, "n", zpack.order, zpack.planes)
        zero = replace(zero, pack=zpack)
    return replace(w, layout=draw(st.sampled_from(("nt", "nn"))), pack=pack, scale=scale, zero=zero)


def storage_dtype(w: Weight):
    """The numpy dtype of the stored qweight of w (codegen/storage.py conventions)."""
    if w.pack is not None:
        return np.uint8 if w.pack.container == "uint8" else np.int32
    return {"float16": np.float16, "bfloat16": np.uint16}.get(
        w.dtype, np.int8 if weight_code(w).kind == "int" else np.uint8)
