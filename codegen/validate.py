"""Plain spec data -> validated, frozen `Spec` (or every problem, with its line).

Public API:
    spec_from_dict(d, filename="<dict>") -> Spec          raises SpecErrors
    validate_data(data, ctx) -> Spec                      same, lines from parse_yaml
    specialize_shape(spec, M=None, N=None, K=None) -> Shape   fix sizes, re-checked

The checks are field readers (yaml_source.Reader and the readers below) plus
consistency rules; every problem becomes one `SpecError` pointing at the
line of the offending field (or of its nearest ancestor that exists in the
file), and all of them are reported together.  Reading the YAML text is
yaml_source.py's, finding a spec (file, shipped name) resolve.py's, writing
one back canonical.py's.

The language is documented in docs/spec.md.
"""
from __future__ import annotations

import math
import re
from typing import Optional

from .canonical import spec_to_yaml_dict
from .errors import SpecErrors, UserError
from .spec import (
    ACCUMULATE, ACT_DTYPES, ACTIVATIONS, AXES, CONTAINER_BITS, CONTAINERS,
    FLOAT_ZERO_DTYPES, FORMULAS, INT_ZERO_DTYPES, LAYOUTS, OPS, OUT_DTYPES,
    SCALE_DTYPES, SCALE_LAYOUTS, WEIGHT_CODES, WEIGHT_DTYPES, ZERO_KINDS,
    Activation, Epilogue, Output, Pack, Scale, Shape, Spec, Weight, Zero,
)
from .yaml_source import (
    BAD, Ctx, PathT, Reader, allowed_values, is_int, ok, show,
)

FORMAT_VERSION = 1
NAME_RE = re.compile(r"[a-z0-9_]+")
QUANT_OUT_DTYPES = ("int8", "float8_e4m3")          # out.dtype of op quantize
QUANT_ACT_DTYPES = ("float16", "bfloat16")          # a.dtype of op quantize
# weight formats whose codes already are (signed) numbers: no zero point
FLOAT_WEIGHT_DTYPES = ("float16", "bfloat16", "float8_e4m3", "float8_e5m2",
                       "nf4", "fp4_e2m1", "codebook", "ternary")
SCALE_GROUP_WORDS = ("channel", "tensor")
CODEBOOK_BITS = (1, 2, 3, 4)

TOP_KEYS = ("opgen", "name", "description", "op", "shape", "a", "b",
            "accumulate", "out", "epilogue")
SHAPE_KEYS = ("M", "N", "K")
A_KEYS = ("dtype", "scale")
B_KEYS = ("dtype", "layout", "pack", "scale", "zero", "formula", "codebook", "bits")
PACK_KEYS = ("container", "axis", "order")
SCALE_KEYS = ("dtype", "group", "layout")
ZERO_KEYS = ("kind", "dtype", "pack", "offset", "value")
ZERO_KIND_KEYS = {"none": (), "const": ("value",), "float": ("dtype",),
                  "int": ("dtype", "pack", "offset")}
OUT_KEYS = ("dtype",)
EPILOGUE_KEYS = ("bias", "activation")

DEFAULT_FORMULA = FORMULAS[0]

_MISSING = object()


def _read_pack(ctx: Ctx, value, path: PathT):
    """-> dict(container, axis, order|None) or BAD. Order is checked later."""
    r = Reader.mapping(ctx, value, path, PACK_KEYS, required=("container", "axis"))
    if r is None:
        return BAD
    container = r.choice("container", CONTAINERS, what="pack container")
    axis = r.choice("axis", AXES, what="pack axis")
    order = r.raw("order", None)
    if "order" in r.m:
        if not isinstance(order, list) or not all(is_int(x) for x in order):
            ctx.err(r.p("order"), f"must be a list of integers; got {show(order)}")
            order = BAD
        else:
            order = tuple(order)
    if not r.has("container") or not r.has("axis") or not ok(container, axis, order):
        return BAD
    return {"container": container, "axis": axis, "order": order}


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
    return Pack(pk["container"], pk["axis"], tuple(order))


def _read_scale(ctx: Ctx, value, path: PathT):
    r = Reader.mapping(ctx, value, path, SCALE_KEYS, required=("dtype", "group"))
    if r is None:
        return BAD
    dtype = r.choice("dtype", SCALE_DTYPES, what="scale dtype")
    group = r.pos_int_or_word("group", SCALE_GROUP_WORDS, what="scale group")
    layout = r.choice("layout", SCALE_LAYOUTS, default="kn", what="scale layout")
    if not r.has("dtype") or not r.has("group") or not ok(dtype, group, layout):
        return BAD
    if is_int(group):
        return Scale(dtype, "group", group, layout)
    # layout only matters for a [K/G, N] table; keep the canonical default
    return Scale(dtype, group, None, "kn")


def _read_zero(ctx: Ctx, value, path: PathT):
    """-> dict(kind, dtype, pack(raw dict|None), offset, value) or BAD."""
    r = Reader.mapping(ctx, value, path, ZERO_KEYS, required=("kind",))
    if r is None or not r.has("kind"):
        return BAD
    kind = r.choice("kind", ZERO_KINDS, what="zero kind")
    if kind is BAD:
        return BAD
    bad = False
    for k in ZERO_KEYS[1:]:
        if r.has(k) and k not in ZERO_KIND_KEYS[kind]:
            owners = [kk for kk, keys in ZERO_KIND_KEYS.items() if k in keys]
            ctx.err(r.p(k), f"does not apply to zero kind {kind} "
                            f"(only to kind {' / '.join(owners)})")
            bad = True
    out = {"kind": kind, "dtype": None, "pack": None, "offset": 0, "value": 0}
    if kind == "const":
        if not r.has("value"):
            ctx.err(r.p("value"), "required field missing (zero kind const takes `value`)")
            bad = True
        v = r.integer("value", 0)
        bad |= v is BAD
        out["value"] = v
    elif kind == "float":
        if not r.has("dtype"):
            ctx.err(r.p("dtype"), f"required field missing {allowed_values(FLOAT_ZERO_DTYPES)}")
            bad = True
        d = r.choice("dtype", FLOAT_ZERO_DTYPES, what="float zero dtype")
        bad |= d is BAD
        out["dtype"] = d
    elif kind == "int":
        if not r.has("dtype"):
            ctx.err(r.p("dtype"), f"required field missing {allowed_values(INT_ZERO_DTYPES)}")
            bad = True
        d = r.choice("dtype", INT_ZERO_DTYPES, what="int zero dtype")
        off = r.integer("offset", 0)
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


def _read_formula(r: Reader):
    if not r.has("formula"):
        return DEFAULT_FORMULA
    v = r.raw("formula")
    if isinstance(v, str):
        squeezed = "".join(v.split())
        for f in FORMULAS:
            if "".join(f.split()) == squeezed:
                return f
    r.ctx.err(r.p("formula"), f"{show(v)} is not a supported formula "
                              f"(allowed: {', '.join(repr(f) for f in FORMULAS)})")
    return BAD


def _read_codebook(r: Reader, dtype):
    """-> (bits, codebook tuple) for dtype codebook, (None, None) otherwise, BAD parts."""
    ctx = r.ctx
    if dtype != "codebook":
        if dtype is not BAD:
            for k in ("codebook", "bits"):
                if r.has(k):
                    ctx.err(r.p(k), f"only applies to dtype codebook (b.dtype is {dtype})")
        return None, None
    if not r.has("bits"):
        ctx.err(r.p("bits"), f"required for dtype codebook {allowed_values(CODEBOOK_BITS)}")
    bits = r.integer("bits", BAD, lo=CODEBOOK_BITS[0], hi=CODEBOOK_BITS[-1])
    cb = r.raw("codebook", None)
    if not r.has("codebook"):
        ctx.err(r.p("codebook"), "required for dtype codebook (a list of 2**bits numbers)")
        cb = BAD
    elif not isinstance(cb, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in cb):
        ctx.err(r.p("codebook"), f"must be a list of finite numbers; got {show(cb)}")
        cb = BAD
    else:
        cb = tuple(float(x) for x in cb)
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
    top = Reader.mapping(ctx, data, (), TOP_KEYS, required=("opgen", "name", "op", "a"))

    # opgen: format version
    version = top.raw("opgen", _MISSING)
    if version is not _MISSING and not (is_int(version) and version == FORMAT_VERSION):
        ctx.err(("opgen",), f"unsupported format version {show(version)} "
                           f"(allowed: {FORMAT_VERSION})")
    name = top.string("name", BAD)
    if isinstance(name, str) and not NAME_RE.fullmatch(name):
        ctx.err(("name",), f"{show(name)} is not a valid name (allowed: [a-z0-9_]+)")
        name = BAD
    description = top.string("description", "")
    op = top.choice("op", OPS, default=BAD, what="op")
    accumulate = top.choice("accumulate", ACCUMULATE, default="float32", what="accumulator")

    # shape
    M = N = K = None
    if top.has("shape"):
        sr = Reader.mapping(ctx, top.raw("shape"), ("shape",), SHAPE_KEYS)
        if sr is not None:
            M = sr.pos_int_or_word("M", ("dynamic",), what="M")
            N = sr.pos_int_or_word("N", ("any",), what="N")
            K = sr.pos_int_or_word("K", ("any",), what="K")
    M, N, K = (None if isinstance(x, str) else x for x in (M, N, K))
    Nf = N if is_int(N) else None            # fixed sizes for divisibility rules
    Kf = K if is_int(K) else None

    # a
    a_dtype = a_scale = BAD
    if top.has("a"):
        ar = Reader.mapping(ctx, top.raw("a"), ("a",), A_KEYS, required=("dtype",))
        if ar is not None:
            a_dtype = ar.choice("dtype", ACT_DTYPES, default=BAD, what="activation dtype")
            a_scale = ar.choice("scale", ("row",), default=None, what="activation scale")
            if a_dtype in ("int8", "float8_e4m3") and a_scale is None:
                ctx.err(("a", "scale"), f"{a_dtype} activations need `scale: row` "
                                        f"(a per-row float32 scale)")
            elif a_dtype in ("float16", "bfloat16") and a_scale == "row":
                ctx.err(("a", "scale"), f"{a_dtype} activations take no scale; remove it")

    # out
    out_allowed = {"matmul": OUT_DTYPES, "quantize": QUANT_OUT_DTYPES}.get(
        op, OUT_DTYPES + QUANT_OUT_DTYPES)
    out_dtype = "float16"
    if top.has("out"):
        orr = Reader.mapping(ctx, top.raw("out"), ("out",), OUT_KEYS, required=("dtype",))
        out_dtype = BAD
        if orr is not None and orr.has("dtype"):
            out_dtype = orr.choice("dtype", out_allowed,
                                   what=f"output dtype for op {op}" if op is not BAD
                                   else "output dtype")
    elif op == "quantize":
        ctx.err(("out",), f"required for op quantize {allowed_values(QUANT_OUT_DTYPES)}")
        out_dtype = BAD

    # epilogue
    bias, act = False, "none"
    if top.has("epilogue"):
        er = Reader.mapping(ctx, top.raw("epilogue"), ("epilogue",), EPILOGUE_KEYS)
        if er is not None:
            bias = er.boolean("bias", False)
            act = er.choice("activation", ACTIVATIONS, default="none", what="activation")

    # b
    weight = None
    if op == "quantize" and top.has("b"):
        ctx.err(("b",), "op quantize takes no weight; remove `b`")
    elif op == "matmul" and not top.has("b"):
        ctx.err(("b",), "required for op matmul")
    elif top.has("b"):
        weight = _validate_weight(ctx, top.raw("b"), Nf, Kf, a_dtype)

    # --- cross-field rules ----------------------------------------------------
    w = weight if isinstance(weight, Weight) else None
    if op == "matmul" and weight is None:
        weight = BAD            # missing b (reported)
    if op == "quantize":
        if a_dtype is not BAD and a_dtype not in QUANT_ACT_DTYPES:
            ctx.err(("a", "dtype"), f"op quantize reads {a_dtype} activations; it needs "
                                    f"{allowed_values(QUANT_ACT_DTYPES)}")
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

    ctx.raise_if_any()
    assert ok(name, op, a_dtype, a_scale, out_dtype, accumulate, bias, act, weight), \
        "validator bug: invalid field without an error"
    return Spec(
        name=name, op=op, a=Activation(a_dtype, a_scale), b=w, out=Output(out_dtype),
        accumulate=accumulate, epilogue=Epilogue(bias, act), shape=Shape(M, N, K),
        description=description, version=FORMAT_VERSION,
    )


def _validate_weight(ctx: Ctx, value, Nf: Optional[int], Kf: Optional[int], a_dtype):
    bp = ("b",)
    r = Reader.mapping(ctx, value, bp, B_KEYS, required=("dtype",))
    if r is None:
        return BAD
    dtype = r.choice("dtype", WEIGHT_DTYPES, default=BAD, what="weight dtype")
    layout = r.choice("layout", LAYOUTS, default="nt", what="weight layout")
    pk = _read_pack(ctx, r.raw("pack"), r.p("pack")) if r.has("pack") else None
    scale = _read_scale(ctx, r.raw("scale"), r.p("scale")) if r.has("scale") else None
    zero = _read_zero(ctx, r.raw("zero"), r.p("zero")) if r.has("zero") else None
    formula = _read_formula(r)
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
            Pz = CONTAINER_BITS[zpack.container] // WEIGHT_CODES[zero["dtype"]].bits
            if scale.granularity == "tensor":
                ctx.err(zp + ("pack",), "a tensor scale has a single zero point, which "
                                        "cannot be packed; use dtype uint8/int8 without "
                                        "pack, or kind const/float")
            elif scale.granularity == "channel" and zpack.axis != "n":
                ctx.err(zp + ("pack", "axis"), "channel zero points form a vector along n; "
                                               "the pack axis must be n (allowed: n)")
            elif zpack.axis == "n" and Nf is not None and Nf % Pz:
                ctx.err(zp + ("pack", "axis"), f"packing {Pz} zero points per "
                                               f"{zpack.container} along n needs shape.N to "
                                               f"be a multiple of {Pz}; shape.N is {Nf}")
            elif (scale.granularity == "group" and zpack.axis == "k" and Kf is not None
                  and Kf % scale.group == 0 and (Kf // scale.group) % Pz):
                ctx.err(zp + ("pack", "axis"), f"packing {Pz} zero points per "
                                               f"{zpack.container} along k needs K/group = "
                                               f"{Kf // scale.group} to be a multiple of {Pz}")
        if ok(zero["dtype"], zero["offset"], zero["value"], zpack):
            zobj = Zero(kind=kind, dtype=zero["dtype"], pack=zpack,
                        offset=zero["offset"], value=zero["value"])
        else:
            zero = BAD

    # what the activation type demands of the weight
    group_scale = isinstance(scale, Scale) and scale.granularity == "group"
    zkind = zero["kind"] if isinstance(zero, dict) else None
    if a_dtype == "int8":
        if dtype not in ("int8", BAD):
            ctx.err(r.p("dtype"), f"int8 activations need int8 weights; got {dtype}")
        if group_scale:
            ctx.err(sp + ("group",), "int8 activations need a channel or tensor weight scale "
                                     "(or none); group scales cannot be applied after an "
                                     "int32 dot product")
        if zkind not in (None, "none"):
            ctx.err(zp + ("kind",), "int8 activations need weights without zero points "
                                    "(allowed: none)")
    elif a_dtype == "float8_e4m3":
        if dtype not in ("float8_e4m3", BAD):
            ctx.err(r.p("dtype"), f"float8_e4m3 activations need float8_e4m3 weights; "
                                  f"got {dtype}")
        if group_scale:
            ctx.err(sp + ("group",), "float8_e4m3 activations need a channel or tensor "
                                     "weight scale (or none)")

    if not ok(dtype, layout, pk, scale, zero, formula, cbits, codebook):
        return BAD
    return Weight(dtype=dtype, layout=layout, pack=pack, scale=scale, zero=zobj,
                  formula=formula, codebook=codebook, bits=cbits)


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
    "spec_from_dict", "validate_data", "specialize_shape",
    "FLOAT_WEIGHT_DTYPES", "QUANT_OUT_DTYPES", "QUANT_ACT_DTYPES",
]
