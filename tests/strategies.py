"""Hypothesis strategies shared by the tests: valid spec dicts (YAML form).

tests/ is on sys.path through its conftest.py, so test modules import this
as `from strategies import valid_spec_dicts`.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from opgen.codegen import planner, spec as S
from opgen.codegen.validate import FLOAT_WEIGHT_DTYPES, zero_range


def _lcm(*xs):
    out = 1
    for x in xs:
        out = out * x // math.gcd(out, x)
    return out


def _maybe(draw, d, key, value, default=None):
    """Put key: value into d, or (when value is the default) sometimes leave it out."""
    if value == default and draw(st.booleans()):
        return
    d[key] = value


@st.composite
def pack_dicts(draw, bits, axis=None):
    container = draw(st.sampled_from([c for c in S.CONTAINERS if S.CONTAINER_BITS[c] % bits == 0]))
    P = S.CONTAINER_BITS[container] // bits
    pk = {"container": container, "axis": axis or draw(st.sampled_from(S.AXES))}
    order = draw(st.one_of(st.none(), st.just(list(range(P))), st.permutations(list(range(P)))))
    if order is not None:
        pk["order"] = list(order)
    return pk, P


def _a8_zero_points(a_dtype, wdtype, zero) -> range:
    """The const zero points (or int zero offsets) validate.zero_range allows
    8-bit activations over sub-byte codes: empty where none is exact."""
    w = S.Weight(dtype=wdtype, zero=zero)
    lo, hi, _ = zero_range(S.Spec("z", "matmul", S.Activation(a_dtype, "row"), w, S.Output()))
    return range(lo, hi + 1)


@st.composite
def valid_spec_dicts(draw):
    op = draw(st.sampled_from(["matmul"] * 5 + ["quantize"]))
    d = {"opgen": 1, "name": draw(st.from_regex(r"[a-z_][a-z0-9_]{0,23}", fullmatch=True)), "op": op}
    if draw(st.booleans()):
        d["description"] = draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30))
    shape = {}
    if draw(st.booleans()):
        shape["M"] = draw(st.sampled_from(["dynamic", 1, 16, 4096]))

    if op == "quantize":
        d["a"] = {"dtype": draw(st.sampled_from(["float16", "bfloat16"]))}
        d["out"] = {"dtype": draw(st.sampled_from(["int8", "float8_e4m3"]))}
        if draw(st.booleans()):
            shape["K"] = draw(st.sampled_from(["any", 64, 4096]))
        if draw(st.booleans()):
            d["epilogue"] = {"bias": False, "activation": "none"}
        if shape:
            d["shape"] = shape
        return d

    # 8-bit activations (docs/spec.md, Activation/weight combinations): their own
    # 8-bit weights or sub-byte integer codes (W4A8, BitNet A8); "int32": int8
    # ones without a scale, the raw int32 accumulator out
    combo = draw(st.sampled_from(["a16"] * 4 + ["int8", "fp8", "int32"]))
    if combo == "a16":
        d["a"] = {"dtype": draw(st.sampled_from(["float16", "bfloat16"]))}
        wdtype = draw(st.sampled_from(S.WEIGHT_DTYPES))
        _maybe(draw, d, "accumulate", "float32", "float32")
    else:
        a_dtype = "float8_e4m3" if combo == "fp8" else "int8"
        d["a"] = {"dtype": a_dtype} if combo == "int32" else {"dtype": a_dtype, "scale": "row"}
        wdtype = draw(st.sampled_from([a_dtype] * 3 + list(S.SUB_BYTE_INT_DTYPES)))
        if a_dtype == "int8":
            d["accumulate"] = "int32"
        else:
            _maybe(draw, d, "accumulate", "float32", "float32")
    codes = combo == "a16" or wdtype in S.SUB_BYTE_INT_DTYPES   # group scales, zero points

    b = {"dtype": wdtype}
    _maybe(draw, b, "layout", draw(st.sampled_from(S.LAYOUTS)), "nt")
    if wdtype == "codebook":
        bits = draw(st.sampled_from([1, 2, 4]))
        b["bits"] = bits
        b["codebook"] = draw(st.lists(st.floats(-8, 8, allow_nan=False, width=32),
                                      min_size=1 << bits, max_size=1 << bits))
    else:
        bits = S.WEIGHT_CODES[wdtype].bits
    P, pack_axis = 1, None
    if bits < 8:
        b["pack"], P = draw(pack_dicts(bits))
        pack_axis = b["pack"]["axis"]

    # scale
    grans = ["none", "channel", "tensor"] if combo != "int32" else ["none"]
    if wdtype not in ("float16", "bfloat16") and codes and combo != "int32":
        grans += ["group", "group"]
    gran = draw(st.sampled_from(grans))
    group = None
    if gran != "none":
        sdtypes = [x for x in S.SCALE_DTYPES if gran == "group" or x != "e8m0"]
        sc = {"dtype": draw(st.sampled_from(sdtypes))}
        if gran == "group":
            step = P if pack_axis == "k" else 1
            group = step * draw(st.integers(1, 64))
            sc["group"] = group
            _maybe(draw, sc, "layout", draw(st.sampled_from(S.SCALE_LAYOUTS)), "kn")
        else:
            sc["group"] = gran
        b["scale"] = sc

    # zero point
    # (bfloat16 holds |x| <= 256 exactly: q - z of 8-bit codes and zero points of opposite
    # signs does not fit, validate.zero_range; 8-bit activations: the zero dtypes some
    # offset fits)
    zdtypes = [z for z in S.INT_ZERO_DTYPES if (gran != "tensor" or S.WEIGHT_CODES[z].bits == 8)
               and (d["a"]["dtype"] != "bfloat16" or z.startswith("int") == wdtype.startswith("int"))
               and (combo == "a16" or _a8_zero_points(a_dtype, wdtype, S.Zero("int", z)))
               ] if codes else []
    kinds = ["none"]
    if gran != "none" and wdtype not in FLOAT_WEIGHT_DTYPES and codes:
        kinds += ["const"] + (["float"] if combo == "a16" else [])   # (a8: q - z an integer)
        if zdtypes:
            kinds += ["int", "int"]
    kind = draw(st.sampled_from(kinds))
    dn, dk = _lcm(P if pack_axis == "n" else 1), _lcm(P if pack_axis == "k" else 1, group or 1)
    if kind == "none":
        if draw(st.booleans()):
            b["zero"] = {"kind": "none"}
    elif kind == "const":
        # (validate.zero_range: bf16 holds |q - z| <= 256, so with uint8 codes z >= -1;
        # bf16 int4: up to 120)
        values = range(-1, 101) if combo == "a16" else _a8_zero_points(a_dtype, wdtype, S.Zero("const"))
        b["zero"] = {"kind": "const", "value": draw(st.sampled_from(values))}
    elif kind == "float":
        b["zero"] = {"kind": "float", "dtype": draw(st.sampled_from(S.FLOAT_ZERO_DTYPES))}
    else:
        zd = draw(st.sampled_from(zdtypes))
        z = {"kind": "int", "dtype": zd}
        zbits = S.WEIGHT_CODES[zd].bits
        if zbits < 8:
            z["pack"], Pz = draw(pack_dicts(zbits, axis="n" if gran == "channel" else None))
            if z["pack"]["axis"] == "n":
                dn = _lcm(dn, Pz)
            else:
                dk = _lcm(dk, group * Pz)
        offsets = range(-1, 2) if combo == "a16" else _a8_zero_points(a_dtype, wdtype, S.Zero("int", zd))
        _maybe(draw, z, "offset", draw(st.sampled_from(offsets)), 0)   # (a16: bf16, uint8: -1..1)
        b["zero"] = z
    if draw(st.booleans()):
        # (8-bit activations take the integer q - z: with a zero point, no q * s - z)
        any_formula = combo == "a16" or kind == "none"
        b["formula"] = draw(st.sampled_from(["(q - z) * s", "(q-z)*s"]
                                            + (["q * s - z", "q*s - z"] if any_formula else [])))
    d["b"] = b

    # fixed sizes the kernels take too (planner.shape_problems): N a multiple of 8 and of
    # 16-byte rows of [K, N] weights (at most 128 one-bit codes), K a multiple of 32
    dn, dk = _lcm(dn, 128), _lcm(dk, planner.K_ALIGN)
    if draw(st.booleans()):
        shape["N"] = draw(st.one_of(st.just("any"), st.integers(1, 64).map(lambda m: m * dn)))
    if draw(st.booleans()):
        shape["K"] = draw(st.one_of(st.just("any"), st.integers(1, 64).map(lambda m: m * dk)))
    if shape:
        d["shape"] = shape
    if combo == "int32":                 # the raw accumulator: no bias, no activation
        d["out"] = {"dtype": "int32"}
        if draw(st.booleans()):
            d["epilogue"] = {"bias": False, "activation": "none"}
        return d
    out = draw(st.sampled_from(S.OUT_DTYPES))
    _maybe(draw, d, "out", {"dtype": out}, {"dtype": "float16"})
    if draw(st.booleans()):
        d["epilogue"] = {"bias": draw(st.booleans()),
                         "activation": draw(st.sampled_from(S.ACTIVATIONS))}
    return d


def runnable_shape(spec):
    """An (N, K) the spec and the kernel rules both accept, or None."""
    w = spec.b
    n_step, k_step = planner.N_ALIGN, planner.K_ALIGN
    if w.pack is not None:
        P = S.codes_per_container(w)
        n_step, k_step = (_lcm(n_step, P), k_step) if w.pack.axis == "n" else (n_step, _lcm(k_step, P))
    if w.scale is not None and w.scale.granularity == "group":
        k_step = _lcm(k_step, w.scale.group)
    if w.zero.kind == "int" and w.zero.pack is not None:
        Pz = S.CONTAINER_BITS[w.zero.pack.container] // S.WEIGHT_CODES[w.zero.dtype].bits
        if w.zero.pack.axis == "n":
            n_step = _lcm(n_step, Pz)
        else:
            k_step = _lcm(k_step, Pz * (w.scale.group if w.scale.granularity == "group" else 1))
    N = spec.shape.N or n_step * max(1, 256 // n_step)
    K = spec.shape.K or k_step * max(1, 512 // k_step)
    try:
        planner.check_shape(spec, N, K)
    except planner.PlanError:
        return None
    return N, K
