"""Plain spec data -> validated, frozen `Spec` (or every problem, with its line).
(Over 500 lines: the rules between fields all read one partly-read document.)

Public API:
    spec_from_dict(d, filename="<dict>") -> Spec          raises SpecErrors
    validate_data(data, ctx) -> Spec                      same, lines from parse_yaml
    specialize_shape(spec, M=None, N=None, K=None) -> Shape   fix sizes, re-checked

The checks are the fields' own (each read as the field table, fields.py,
says) plus the rules between fields below, and the kernels' size and
exactness rules for what a spec fixes (planner.shape_problems; zero points
the decode subtracts exactly); every problem becomes one `SpecError`
pointing at the line of the offending field (or of its nearest ancestor that
exists in the file), and all of them are reported together.  Reading the
YAML text is yaml_source.py's, finding a spec (file, shipped name)
resolve.py's, writing one back canonical.py's.

The language is documented in docs/spec.md.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from . import lower
from .canonical import spec_to_yaml_dict
from .errors import SpecErrors, UserError
from .fields import (
    CODEBOOK_BITS, CODEBOOK_KEYS, FORMAT_VERSION, OP_ACT_DTYPES, OP_OUT_DTYPES, QUANT_ACT_DTYPES,
    QUANT_OUT_DTYPES, ZERO_KIND_DTYPES, ZERO_KIND_KEYS, ZERO_KIND_REQUIRES, FieldReader,
    open_mapping,
)
from .planner.config import shape_problems
from .spec import (
    A8_DTYPES, CONTAINER_BITS, EXACT_INTS, FINITE_MAX, INT_OUT_DTYPES, INT_ZERO_DTYPES,
    SUB_BYTE_INT_DTYPES, WEIGHT_CODES, Activation, Epilogue, Output, Pack, Scale, Shape, Spec,
    Weight, Zero,
)
from .yaml_source import BAD, Ctx, PathT, allowed_values, is_int, ok, show

# weight formats whose codes already are (signed) numbers: no zero point
FLOAT_WEIGHT_DTYPES = ("float16", "bfloat16", "float8_e4m3", "float8_e5m2",
                       "nf4", "fp4_e2m1", "codebook", "ternary")

# 8-bit activations take their own 8-bit weights (the W8A8 kernels' rules:
# a channel or tensor scale or none, no zero point) or SUB_BYTE_INT_DTYPES.
# The integers each 8-bit activation type holds exactly (int8: its range; e4m3,
# 3 mantissa bits: |x| <= 2^4): every zero point and every q - z of sub-byte
# weights decoded to it must be one of them.
A8_DECODE_INTS = {"int8": (-128, 127), "float8_e4m3": (-16, 16)}


def _read_pack(ctx: Ctx, value, path: PathT):
    """-> dict(container, axis, order|None) or BAD. Order is checked later."""
    r = open_mapping(ctx, value, path, "pack")
    if r is None:
        return BAD
    container, axis, order, planes = r.get("container"), r.get("axis"), r.get("order"), r.get("planes")
    if not ok(container, axis, order, planes):
        return BAD
    return {"container": container, "axis": axis, "order": order, "planes": planes}


def _check_pack(ctx: Ctx, pk: dict, bits: int, path: PathT, what: str) -> Optional[Pack]:
    """Check container/order against the code width; -> Pack or None."""
    cbits = CONTAINER_BITS[pk["container"]]
    if cbits % bits:
        ctx.err(path + ("container",),
                f"a {pk['container']} ({cbits} bits) cannot hold a whole number of "
                f"{bits}-bit {what} codes (container bits must be a multiple of {bits})")
        return None
    P = cbits // bits
    order = pk["order"]
    if order is None:
        order = tuple(range(P))
    elif sorted(order) != list(range(P)):
        ctx.err(path + ("order",),
                f"must be a permutation of 0..{P - 1} (P = {cbits}/{bits} = {P} codes per "
                f"{pk['container']}); got {list(order)}")
        return None
    return Pack(pk["container"], pk["axis"], tuple(order), bool(pk["planes"]))


def _read_scale(ctx: Ctx, value, path: PathT):
    r = open_mapping(ctx, value, path, "scale")
    if r is None:
        return BAD
    dtype, group, layout = r.get("dtype"), r.get("group"), r.get("layout")
    if not ok(dtype, group, layout):
        return BAD
    if is_int(group):
        return Scale(dtype, "group", group, layout)
    # layout only matters for a [K/G, N] table; keep the canonical default
    return Scale(dtype, group, None, "kn")


def _read_zero(ctx: Ctx, value, path: PathT):
    """-> dict(kind, dtype, pack(raw dict|None), offset, value) or BAD."""
    r = open_mapping(ctx, value, path, "zero")
    if r is None or not r.has("kind"):
        return BAD
    kind = r.get("kind")
    if kind is BAD:
        return BAD
    bad = False
    for k in r.table:
        if k != "kind" and r.has(k) and k not in ZERO_KIND_KEYS[kind]:
            owners = [kk for kk, keys in ZERO_KIND_KEYS.items() if k in keys]
            ctx.err(r.p(k), f"does not apply to zero kind {kind} "
                            f"(only to kind {' / '.join(owners)})")
            bad = True
    for k in ZERO_KIND_REQUIRES[kind]:
        if not r.has(k):
            allowed = allowed_values(ZERO_KIND_DTYPES[kind]) if k == "dtype" else \
                f"(zero kind {kind} takes `{k}`)"
            ctx.err(r.p(k), f"required field missing {allowed}")
            bad = True
    out = {"kind": kind, "dtype": None, "pack": None, "offset": 0, "value": 0}
    if kind == "const":
        v = r.get("value")
        bad |= v is BAD
        out["value"] = v
    elif kind == "float":
        d = r.choice("dtype", ZERO_KIND_DTYPES[kind], what="float zero dtype")
        bad |= d is BAD
        out["dtype"] = d
    elif kind == "int":
        d = r.choice("dtype", ZERO_KIND_DTYPES[kind], what="int zero dtype")
        off = r.get("offset")
        pk = _read_pack(ctx, r.raw("pack"), r.p("pack")) if r.has("pack") else None
        bad |= not ok(d, off, pk)
        out.update(dtype=d, offset=off, pack=pk)
        if d is not BAD and d is not None:
            zbits = WEIGHT_CODES[d].bits
            if zbits < 8 and not r.has("pack"):
                ctx.err(r.p("pack"), f"{d} zero points ({zbits} bits) must be packed: "
                                     f"add `pack: {{container: ..., axis: ...}}`")
                bad = True
            elif zbits >= 8 and r.has("pack"):
                ctx.err(r.p("pack"), f"{d} zero points are stored one per element; "
                                     f"remove `pack`")
                bad = True
            elif pk not in (None, BAD):
                packed = _check_pack(ctx, pk, zbits, r.p("pack"), "zero-point")
                if packed is None:
                    bad = True
                out["pack"] = packed
    return BAD if bad else out


def _read_codebook(r: FieldReader, dtype):
    """-> (bits, codebook tuple) for dtype codebook, (None, None) otherwise, BAD parts."""
    ctx = r.ctx
    if dtype != "codebook":
        if dtype is not BAD:
            for k in CODEBOOK_KEYS:
                if r.has(k):
                    ctx.err(r.p(k), f"only applies to dtype codebook (b.dtype is {dtype})")
        return None, None
    if not r.has("bits"):
        ctx.err(r.p("bits"), f"required for dtype codebook {allowed_values(CODEBOOK_BITS)}")
    bits = r.get("bits", BAD)
    cb = r.get("codebook", BAD)
    if not r.has("codebook"):
        ctx.err(r.p("codebook"), "required for dtype codebook (a list of 2**bits numbers)")
    elif cb is not BAD:
        if bits is not BAD and len(cb) != 1 << bits:
            ctx.err(r.p("codebook"), f"has {len(cb)} entries; a {bits}-bit codebook needs "
                                     f"exactly {1 << bits}")
            cb = BAD
    return bits, cb


# --- the whole spec ---------------------------------------------------------------

def validate_data(data, ctx: Ctx) -> Spec:
    """Parsed spec data -> Spec; every problem is reported into ctx (located
    by its lines) and raised together as SpecErrors."""
    if not isinstance(data, dict):
        ctx.err((), f"the document must be a mapping of spec fields; got {show(data)}")
        ctx.raise_if_any()
    top = open_mapping(ctx, data, (), "spec")
    top.get("opgen")                        # the format version: checked, not kept
    name = top.get("name")
    description = top.get("description")
    op = top.get("op")
    accumulate = top.get("accumulate")

    # shape
    M = N = K = None
    if top.has("shape"):
        sr = open_mapping(ctx, top.raw("shape"), ("shape",), "shape")
        if sr is not None:
            M, N, K = sr.get("M"), sr.get("N"), sr.get("K")
    M, N, K = (None if isinstance(x, str) else x for x in (M, N, K))
    Nf = N if is_int(N) else None            # fixed sizes for divisibility rules
    Kf = K if is_int(K) else None

    # a
    a_dtype = a_scale = BAD
    if top.has("a"):
        ar = open_mapping(ctx, top.raw("a"), ("a",), "a")
        if ar is not None:
            a_dtype, a_scale = ar.get("dtype"), ar.get("scale")

    # out
    out_dtype = "float16"
    if top.has("out"):
        orr = open_mapping(ctx, top.raw("out"), ("out",), "out")
        out_dtype = BAD
        if orr is not None and orr.has("dtype"):
            if op in OP_OUT_DTYPES:
                out_dtype = orr.choice("dtype", OP_OUT_DTYPES[op], what=f"output dtype for op {op}")
            else:
                out_dtype = orr.get("dtype")
    elif op == "quantize":
        ctx.err(("out",), f"required for op quantize {allowed_values(QUANT_OUT_DTYPES)}")
        out_dtype = BAD

    # epilogue
    bias, act = False, "none"
    if top.has("epilogue"):
        er = open_mapping(ctx, top.raw("epilogue"), ("epilogue",), "epilogue")
        if er is not None:
            bias, act = er.get("bias"), er.get("activation")

    # b
    weight = None
    if op == "quantize" and top.has("b"):
        ctx.err(("b",), "op quantize takes no weight; remove `b`")
    elif op == "matmul" and not top.has("b"):
        ctx.err(("b",), "required for op matmul")
    elif top.has("b"):
        weight = _validate_weight(ctx, top.raw("b"), Nf, Kf, a_dtype, out_dtype)

    # --- cross-field rules ----------------------------------------------------
    w = weight if isinstance(weight, Weight) else None
    if op == "matmul" and weight is None:
        weight = BAD            # missing b (reported)
    if op == "quantize":
        if a_dtype is not BAD and a_dtype not in OP_ACT_DTYPES[op]:
            ctx.err(("a", "dtype"), f"op quantize reads {a_dtype} activations; it needs "
                                    f"{allowed_values(OP_ACT_DTYPES[op])}")
        if bias is True:
            ctx.err(("epilogue", "bias"), "op quantize has no epilogue (bias must be false)")
        if act not in ("none", BAD):
            ctx.err(("epilogue", "activation"),
                    "op quantize has no epilogue (activation must be none)")
        if N is not None and N is not BAD:
            ctx.err(("shape", "N"), "op quantize has no N dimension (leave it `any`)")
    if accumulate == "int32" and a_dtype not in ("int8", BAD):
        ctx.err(("accumulate",), f"int32 accumulation needs int8 activations "
                                 f"(a.dtype is {a_dtype}); use float32")
    if a_dtype == "int8" and accumulate == "float32":
        ctx.err(("accumulate",), "int8 activations need `accumulate: int32`")
    if a_dtype == "float8_e4m3" and accumulate == "int32":
        ctx.err(("accumulate",), "float8_e4m3 activations need `accumulate: float32`")
    _check_activation_scale(ctx, a_dtype, a_scale, out_dtype)
    if out_dtype in INT_OUT_DTYPES:
        _check_int_output(ctx, a_dtype, bias, act)

    ctx.raise_if_any()
    assert ok(name, op, a_dtype, a_scale, out_dtype, accumulate, bias, act, weight), \
        "validator bug: invalid field without an error"
    spec = Spec(
        name=name, op=op, a=Activation(a_dtype, a_scale), b=w, out=Output(out_dtype),
        accumulate=accumulate, epilogue=Epilogue(bias, act), shape=Shape(M, N, K),
        description=description, version=FORMAT_VERSION,
    )
    for path, message in kernel_problems(spec):
        ctx.err(path, message)
    ctx.raise_if_any()
    return spec


def _check_activation_scale(ctx: Ctx, a_dtype, a_scale, out_dtype) -> None:
    if a_dtype in A8_DTYPES and a_scale is None:
        if out_dtype not in INT_OUT_DTYPES:
            raw = " unless out.dtype is int32 (the raw accumulator)" if a_dtype == "int8" else ""
            ctx.err(("a", "scale"), f"{a_dtype} activations need `scale: row` "
                                    f"(a per-row float32 scale){raw}")
    elif a_dtype in ("float16", "bfloat16") and a_scale == "row":
        ctx.err(("a", "scale"), f"{a_dtype} activations take no scale; remove it")
    elif a_scale == "row" and out_dtype in INT_OUT_DTYPES:
        ctx.err(("a", "scale"), "an int32 output is the raw accumulator, which no scale "
                                "applies to: remove a.scale, or choose out.dtype float16, "
                                "bfloat16 or float32")


def _check_int_output(ctx: Ctx, a_dtype, bias, act) -> None:
    """out.dtype int32: Σ_k A[m, k] · q(k, n) as the int32 MMA leaves it (its
    weight-side rule, no b.scale, is _validate_weight's)."""
    if a_dtype not in ("int8", BAD):
        ctx.err(("out", "dtype"), f"int32 is the raw int32 accumulator of int8 activations; "
                                  f"a.dtype is {a_dtype} (allowed with it: float16, bfloat16, "
                                  f"float32)")
    if bias is True:
        ctx.err(("epilogue", "bias"), "an int32 output is the raw accumulator: no bias "
                                      "(allowed: false)")
    if act not in ("none", BAD):
        ctx.err(("epilogue", "activation"), "an int32 output is the raw accumulator: no "
                                            "activation (allowed: none)")


# --- what the kernels hold -----------------------------------------------------------

def kernel_problems(spec: Spec) -> List[Tuple[PathT, str]]:
    """What a spec the language accepts asks beyond the kernels: the sizes it
    fixes against the rule `opgen build` and `opgen.load` apply to every size
    (planner.shape_problems), and numbers the decode must hold exactly."""
    out = [(("shape", dim), message) for dim, message in
           shape_problems(spec, N=spec.shape.N, K=spec.shape.K, M=spec.shape.M)]
    w = spec.b
    if w is None or decode_ints(spec) is None:
        return out
    if w.zero.kind in ("const", "int"):
        key = "value" if w.zero.kind == "const" else "offset"
        v = getattr(w.zero, key)
        lo, hi, why = zero_range(spec)
        if lo > hi:         # no offset fits this zero dtype at all
            fit = [d for d in INT_ZERO_DTYPES if _zero_dtype_fits(spec, d)]
            zc = WEIGHT_CODES[w.zero.dtype]
            out.append((("b", "zero", "dtype"), f"{w.zero.dtype} zero points ({zc.lo}..{zc.hi}) "
                                                f"cannot all be exact: {why} "
                                                f"{allowed_values(fit)}"))
        elif not lo <= v <= hi:
            out.append((("b", "zero", key), f"{v} is out of range (allowed: {lo}..{hi}: {why})"))
    if w.codebook is not None and spec.a.dtype in FINITE_MAX:
        top = FINITE_MAX[spec.a.dtype]
        big = [x for x in w.codebook if abs(x) > top]
        if big:
            out.append((("b", "codebook"), f"{big[0]:g} is beyond {spec.a.dtype}, the type the "
                                           f"codes decode to (allowed: |x| <= {top:g})"))
    return out


def decode_ints(spec: Spec) -> Optional[Tuple[int, int]]:
    """(L, H): the integers the kernels' decode of spec's weight codes holds
    exactly, so zero points and q - z must lie in L..H; None where no zero
    point or code passes through such a decode (8-bit activations with their
    own 8-bit weights). float16 / bfloat16 activations: the weights are
    decoded to that type (EXACT_INTS); int8 / fp8 activations with sub-byte
    weights: to the 8-bit type (A8_DECODE_INTS)."""
    a = spec.a.dtype
    if a in EXACT_INTS:
        return -EXACT_INTS[a], EXACT_INTS[a]
    if a in A8_DECODE_INTS and spec.b is not None and spec.b.dtype in SUB_BYTE_INT_DTYPES:
        return A8_DECODE_INTS[a]
    return None


def zero_range(spec: Spec) -> Tuple[int, int, str]:
    """(lo, hi, why) of the zero point of a spec whose decode has exact
    integer bounds (decode_ints): of b.zero.value (kind const) or
    b.zero.offset (kind int); lo > hi when no value fits. The decode
    subtracts zero points in the type it decodes to, so each zero point and
    every q - z must be integers that type holds exactly; a const zero point
    also joins the magic number of the fast float16/bfloat16 integer decode
    (lower.decode_plan), and that constant must be exact too."""
    w, a = spec.b, spec.a.dtype
    L, H = decode_ints(spec)
    held = (f"an integer {a} holds exactly, |x| <= {H}" if L == -H else
            f"an integer {a} holds, {L}..{H}")
    q = WEIGHT_CODES[w.dtype]
    codes = f"the {w.dtype} codes q = {q.lo}..{q.hi}"
    if w.zero.kind == "const":
        lo, hi = q.hi - H, q.lo - L
        why = f"every q - z over {codes} must be {held}"
        if a in EXACT_INTS:             # the float16 / bfloat16 magic-number decode
            at_zero = dataclasses.replace(spec, b=dataclasses.replace(w, zero=Zero("const")))
            dec = lower.decode_plan(lower.weight_layout(at_zero), lower.numerics(at_zero))
            if dec.method == "magic" and H - dec.sub_value < hi:
                hi = H - dec.sub_value
                why += f"; so must {dec.sub_value} + z, the constant the decode subtracts"
        return lo, hi, why
    zc = WEIGHT_CODES[w.zero.dtype]
    lo = max(L - zc.lo, q.hi - zc.lo - H)
    hi = min(H - zc.hi, q.lo - zc.hi - L)
    why = (f"every zero point z = stored + offset over the {w.zero.dtype} codes "
           f"{zc.lo}..{zc.hi}, and every q - z over {codes}, must be {held}")
    return lo, hi, why


def _zero_dtype_fits(spec: Spec, zero_dtype: str) -> bool:
    """Whether some offset makes every zero point of this dtype exact."""
    w = dataclasses.replace(spec.b, zero=Zero("int", zero_dtype))
    lo, hi, _ = zero_range(dataclasses.replace(spec, b=w))
    return lo <= hi


def _validate_weight(ctx: Ctx, value, Nf: Optional[int], Kf: Optional[int], a_dtype, out_dtype):
    bp = ("b",)
    r = open_mapping(ctx, value, bp, "b")
    if r is None:
        return BAD
    dtype, layout = r.get("dtype"), r.get("layout")
    pk = _read_pack(ctx, r.raw("pack"), r.p("pack")) if r.has("pack") else None
    scale = _read_scale(ctx, r.raw("scale"), r.p("scale")) if r.has("scale") else None
    zero = _read_zero(ctx, r.raw("zero"), r.p("zero")) if r.has("zero") else None
    formula = r.get("formula")
    cbits, codebook = _read_codebook(r, dtype)

    bits = None
    if dtype not in (BAD, "codebook"):
        bits = WEIGHT_CODES[dtype].bits
    elif dtype == "codebook" and cbits is not BAD:
        bits = cbits

    # packing
    pack = None
    P = 1
    if bits is not None:
        if bits < 8 and not r.has("pack"):
            ctx.err(r.p("pack"), f"{dtype} weights ({bits} bits) must be packed: add "
                                 f"`pack: {{container: ..., axis: ...}}`")
            pk = BAD
        elif bits >= 8 and r.has("pack"):
            ctx.err(r.p("pack"), f"{dtype} weights ({bits} bits) are stored one per "
                                 f"element; remove `pack`")
            pk = BAD
        elif pk not in (None, BAD):
            pack = _check_pack(ctx, pk, bits, r.p("pack"), "weight")
            if pack is None:
                pk = BAD
            else:
                P = CONTAINER_BITS[pack.container] // bits
    if pack is not None:
        dim, size = ("K", Kf) if pack.axis == "k" else ("N", Nf)
        if size is not None and size % P:
            ctx.err(r.p("pack") + ("axis",), f"packing {P} codes per {pack.container} along "
                                             f"{pack.axis} needs shape.{dim} to be a multiple "
                                             f"of {P}; shape.{dim} is {size}")

    # scale
    sp = r.p("scale")
    if isinstance(scale, Scale):
        if scale.dtype == "e8m0" and scale.granularity != "group":
            ctx.err(sp + ("dtype",), f"e8m0 (power-of-two) scales need an integer group; "
                                     f"group is {scale.granularity}")
        if dtype in ("float16", "bfloat16") and scale.granularity == "group":
            ctx.err(sp + ("group",), f"{dtype} weights take no scale or a channel/tensor "
                                     f"scale, not group {scale.group}")
        if scale.granularity == "group":
            G = scale.group
            if Kf is not None and Kf % G:
                ctx.err(sp + ("group",), f"group {G} does not divide shape.K = {Kf}")
            if pack is not None and pack.axis == "k" and G % P:
                ctx.err(sp + ("group",), f"group {G} must be a multiple of P = {P} (codes per "
                                         f"{pack.container}) when b.pack.axis is k")

    # zero point
    zp = r.p("zero")
    zobj = Zero()
    if isinstance(zero, dict):
        kind = zero["kind"]
        if kind != "none":
            if dtype in FLOAT_WEIGHT_DTYPES:
                ctx.err(zp + ("kind",), f"zero points on a format that has none: {dtype} "
                                        f"codes are already signed values (allowed: none)")
            if scale is None:
                ctx.err(zp + ("kind",), f"zero kind {kind} needs a scale (b.scale): "
                                        f"zero points are laid out like the scales")
        zpack = zero["pack"]
        if kind == "int" and isinstance(zpack, Pack) and isinstance(scale, Scale):
            if scale.granularity == "tensor":
                ctx.err(zp + ("pack",), "a tensor scale has a single zero point, which "
                                        "cannot be packed; use dtype uint8/int8 without "
                                        "pack, or kind const/float")
            elif scale.granularity == "channel" and zpack.axis != "n":
                ctx.err(zp + ("pack", "axis"), "channel zero points form a vector along n; "
                                               "the pack axis must be n (allowed: n)")
            # (whole words of them at a fixed N or K: planner.shape_problems, for every size)
        if ok(zero["dtype"], zero["offset"], zero["value"], zpack):
            zobj = Zero(kind=kind, dtype=zero["dtype"], pack=zpack,
                        offset=zero["offset"], value=zero["value"])
        else:
            zero = BAD

    # what the activation type (and an int32 output) demands of the weight
    zkind = zero["kind"] if isinstance(zero, dict) else None
    if a_dtype in A8_DTYPES:
        _check_a8_weight(r, a_dtype, dtype, scale, zkind, formula)
    if out_dtype in INT_OUT_DTYPES and scale is not None:
        ctx.err(sp, "an int32 output is the raw accumulator, which no scale applies to: "
                    "remove b.scale, or choose out.dtype float16, bfloat16 or float32")

    if not ok(dtype, layout, pk, scale, zero, formula, cbits, codebook):
        return BAD
    return Weight(dtype=dtype, layout=layout, pack=pack, scale=scale, zero=zobj,
                  formula=formula, codebook=codebook, bits=cbits)


def _check_a8_weight(r: FieldReader, a_dtype: str, dtype, scale, zkind, formula) -> None:
    """int8 / float8_e4m3 activations: their own 8-bit weights as the W8A8
    kernels take them, or sub-byte integer codes whose q - z is an integer
    (SUB_BYTE_INT_DTYPES; the bounds on z are kernel_problems')."""
    ctx, sp, zp = r.ctx, r.p("scale"), r.p("zero")
    allowed = (a_dtype,) + SUB_BYTE_INT_DTYPES
    if dtype is BAD:
        return
    if dtype not in allowed:
        ctx.err(r.p("dtype"), f"{a_dtype} activations need {a_dtype} weights or integer codes "
                              f"below 8 bits; got {dtype} {allowed_values(allowed)}")
    elif dtype == a_dtype:
        if isinstance(scale, Scale) and scale.granularity == "group":
            ctx.err(sp + ("group",), f"{dtype} weights with {a_dtype} activations take a "
                                     f"channel or tensor scale or none, not group "
                                     f"{scale.group} (group scales: weights below 8 bits)")
        if zkind not in (None, "none") and dtype not in FLOAT_WEIGHT_DTYPES:
            ctx.err(zp + ("kind",), f"{dtype} weights with {a_dtype} activations take no zero "
                                    f"point (allowed: none; zero points: weights below 8 bits)")
    else:
        if formula not in (BAD, "(q - z) * s") and zkind not in (None, "none"):
            ctx.err(r.p("formula"), f"{a_dtype} activations multiply the integer q - z, then "
                                    f"scale the sum: formula {formula!r} with a zero point "
                                    f"has no such integer (allowed: (q - z) * s)")
        if zkind == "float":
            ctx.err(zp + ("kind",), f"float zero points with {a_dtype} activations: q - z would "
                                    f"not be an integer, which the 8-bit product needs "
                                    f"(allowed: none, const, int)")


# --- public API ---------------------------------------------------------------------

def spec_from_dict(d, filename: str = "<dict>") -> Spec:
    """Validate plain data (as YAML would load it). Errors carry line 0."""
    ctx = Ctx(filename, {}, default_line=0)
    return validate_data(d, ctx)


def specialize_shape(spec: Spec, M: Optional[int] = None, N: Optional[int] = None,
                     K: Optional[int] = None) -> Shape:
    """Shape with the given sizes filled in, checked against the spec.

    A size given here must match a size the spec fixes; the result must pass
    the spec's rules (group divides K, pack divisibility, ...). Raises
    UserError otherwise.
    """
    given = {"M": M, "N": N, "K": K}
    sizes = {}
    for dim, v in given.items():
        fixed = getattr(spec.shape, dim)
        if v is not None:
            if not is_int(v) or v <= 0:
                raise UserError(f"--{dim} must be a positive integer; got {v!r}")
            if fixed is not None and fixed != v:
                raise UserError(f"--{dim} {v} conflicts with spec {spec.name}, "
                                f"which fixes shape.{dim} = {fixed}")
        sizes[dim] = v if v is not None else fixed
    d = spec_to_yaml_dict(spec)
    d["shape"] = {"M": sizes["M"] or "dynamic", "N": sizes["N"] or "any",
                  "K": sizes["K"] or "any"}
    try:
        spec_from_dict(d, filename=spec.name)
    except SpecErrors as e:
        msgs = "; ".join(f"{x.path}: {x.message}" for x in e.errors)
        shown = " ".join(f"{k}={v}" for k, v in sizes.items() if v is not None)
        raise UserError(f"sizes {shown} do not fit spec {spec.name}: {msgs}") from None
    return Shape(**sizes)



__all__ = [
    "spec_from_dict", "validate_data", "specialize_shape", "kernel_problems", "zero_range",
    "decode_ints", "FLOAT_WEIGHT_DTYPES", "SUB_BYTE_INT_DTYPES", "A8_DECODE_INTS",
    "QUANT_OUT_DTYPES", "QUANT_ACT_DTYPES",
]
