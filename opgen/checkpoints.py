"""Checkpoint state dicts -> the storage tensors of opgen's shipped specs.

Pure numpy (no torch, no GPU): each `from_*` takes one layer's tensors as
the project that made the checkpoint saves them (numpy arrays; bfloat16 as
np.uint16 bits, as everywhere in opgen) and returns a dict with "qweight",
"scales", "zeros" (when the spec has them) and "bias" (when the checkpoint has
one) in the exact storage of the corresponding shipped spec, ready for
`opgen.load(spec, N, K)` or `reference.dequantize(spec, tensors, N, K)`.

GPTQ and AWQ are stored the way their shipped specs describe them, so
loading them is validation plus passthrough (spec= another storage of the
same weight: moved there by codegen.transcode); the op moves them into the
kernels' layout. bitsandbytes NF4 is a reshape of the flat storage. HF
BitNet packs four planes of rows per byte (HF_BITNET_PACK): its codes move
to bitnet_b158's storage by codegen.transcode, its scale is inverted.

Every mismatch raises a ValueError that starts with the checkpoint's own name
for the tensor, e.g.
    qzeros: shape [32, 512], expected [32, 64] = [K/128, N/8] for N=4096, K=4096, group 128
"""
from __future__ import annotations

import dataclasses
import json
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

from .codegen import numerics as nx
from .codegen.spec import (CONTAINER_BITS, NF4_TABLE, WEIGHT_CODES, Pack, Spec, codes_per_container,
                           stored_shapes)
from .codegen.planner import held_name
from .codegen.resolve import as_spec
from .codegen.transcode import TranscodeError, transcode

__all__ = ["FORMATS", "expected_tensors", "validate_tensors", "n_axes", "stack_refusal", "from_gptq",
           "from_awq", "from_bnb_nf4", "from_bitnet_hf", "convert", "sub_state"]

# checkpoint format -> the shipped spec that stores it as the checkpoint does
# (the op and QuantLinear move it into the kernels' layout once, at load:
# planner.execution_spec).
FORMATS = {
    "gptq_v1": "gptq_v1_w4a16_g128",
    "gptq_v2": "gptq_v2_w4a16_g128",
    "awq": "awq_w4a16_g128",
    "bnb_nf4": "bnb_nf4",
    "bitnet_hf": "bitnet_b158",
}


def sub_state(state: Mapping, prefix: str) -> Dict:
    """One layer's tensors out of a whole-model state dict:
    sub_state(sd, "model.layers.0.mlp.up_proj.") -> {"qweight": ..., ...}."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


# --- what a spec stores ------------------------------------------------------------------

def _dtype_name(dt) -> str:
    """numpy and torch dtypes alike: 'int32', 'float16', 'bfloat16', ..."""
    return str(dt).replace("torch.", "")


def _elem_dtypes(dtype: str, signed: bool) -> Tuple[str, ...]:
    """Accepted dtype names for one unpacked element of spec dtype `dtype`
    (first = what opgen writes; bfloat16 may come as its uint16 bits)."""
    if dtype in ("float16", "float32"):
        return (dtype,)
    if dtype == "bfloat16":
        return ("bfloat16", "uint16")
    if dtype in ("float8_e4m3", "float8_e5m2"):
        return ("uint8", dtype + ("fn" if dtype == "float8_e4m3" else ""))
    if dtype == "e8m0":
        return ("uint8", "float8_e8m0fnu")
    return ("int8",) if signed else ("uint8",)


def _container_dtypes(container: str) -> Tuple[str, ...]:
    return ("int32", "uint32") if container == "int32" else ("uint8",)


def _sym_dims(spec: Spec, key: str) -> str:
    """The stored shape in symbols, e.g. '[K/8, N]', for error messages."""
    w = spec.b
    if key == "qweight":
        axes = ("n", "k") if w.layout == "nt" else ("k", "n")
        P = codes_per_container(w)
        dims = [a.upper() + (f"/{P}" if w.pack and w.pack.axis == a and P > 1 else "")
                for a in axes]
    else:
        s = w.scale
        if s.granularity == "tensor":
            return "[1]"
        axes = ("n",) if s.granularity == "channel" else (("k", "n") if s.layout == "kn" else ("n", "k"))
        dims = ["N" if a == "n" else f"K/{s.group}" for a in axes]
        z = w.zero
        if key == "zeros" and z.kind == "int" and z.pack is not None:
            P = CONTAINER_BITS[z.pack.container] // WEIGHT_CODES[z.dtype].bits
            i = axes.index(z.pack.axis) if z.pack.axis in axes else 0
            dims[i] = f"({dims[i]})/{P}" if "/" in dims[i] else f"{dims[i]}/{P}"
    return "[" + ", ".join(dims) + "]"


def expected_tensors(spec: Spec, N: int, K: int) -> Dict[str, Tuple[Tuple[int, ...], Tuple[str, ...]]]:
    """name -> (stored shape, accepted dtype names) of each weight tensor."""
    w = spec.b
    if w is None:
        raise ValueError(f"spec {spec.name!r} (op {spec.op}) has no weight")
    code = WEIGHT_CODES.get(w.dtype)
    signed = code is not None and code.kind == "int"
    shapes = stored_shapes(spec, N, K)
    qd = _container_dtypes(w.pack.container) if w.pack else _elem_dtypes(w.dtype, signed)
    out = {"qweight": (shapes["qweight"], qd)}
    if w.scale is not None:
        out["scales"] = (shapes["scales"], _elem_dtypes(w.scale.dtype, False))
    z = w.zero
    if z.kind == "int":
        zd = (_container_dtypes(z.pack.container) if z.pack
              else _elem_dtypes(z.dtype, WEIGHT_CODES[z.dtype].kind == "int"))
        out["zeros"] = (shapes["zeros"], zd)
    elif z.kind == "float":
        out["zeros"] = (shapes["zeros"], _elem_dtypes(z.dtype, False))
    return out


def n_axes(spec: Spec) -> Dict[str, int]:
    """The axis of each of spec's stored tensors that grows with N (what
    QuantLinear.stacked joins along); ValueError naming a tensor that has
    none (a tensor scale: one for every row), and the spec the user holds
    (an execution spec's is named after it)."""
    N, K = 64, 256 * 1024      # (every alignment rule holds at N and 2 N)
    at, twice = expected_tensors(spec, N, K), expected_tensors(spec, 2 * N, K)
    out = {}
    for name, (shape, _) in at.items():
        grows = [i for i, (a, b) in enumerate(zip(shape, twice[name][0])) if a != b]
        if len(grows) != 1:
            raise ValueError(f"fuse: {held_name(spec)}: its {name} tensor is one for the whole weight (no "
                             f"n axis), so stacked siblings cannot each keep their own")
        out[name] = grows[0]
    return out


def stack_refusal(spec: Spec) -> Optional[str]:
    """Why layers of spec cannot be stacked (n_axes' message: a tensor with
    no n axis), or None."""
    try:
        n_axes(spec)
    except ValueError as e:
        return str(e)
    return None


def _context(spec: Spec, N: int, K: int) -> str:
    s = spec.b.scale
    group = f", group {s.group}" if s is not None and s.granularity == "group" else ""
    return f"N={N}, K={K}{group}"


def validate_tensors(spec: Union[Spec, str], tensors: Mapping, N: int, K: int,
                     names: Optional[Mapping[str, str]] = None) -> None:
    """Raise ValueError naming the first tensor that is missing or whose shape
    or dtype is not what `spec` stores for N x K. Anything with .shape and
    .dtype is accepted (numpy arrays, torch tensors). names: the checkpoint's
    own name for a tensor, used in the message ({"zeros": "qzeros"}).
    An optional "bias" must be [N]; other keys are ignored."""
    spec = as_spec(spec)
    names = dict(names or {})
    label = lambda key: names.get(key, key)     # noqa: E731
    want = expected_tensors(spec, N, K)
    for key, (shape, dtypes) in want.items():
        t = tensors.get(key)
        if t is None:
            raise ValueError(f"{label(key)}: missing; spec {spec.name} stores it as "
                             f"{list(shape)} = {_sym_dims(spec, key)} {dtypes[0]} for {_context(spec, N, K)}")
        got = tuple(int(d) for d in t.shape)
        if got != shape:
            raise ValueError(f"{label(key)}: shape {list(got)}, expected {list(shape)} = "
                             f"{_sym_dims(spec, key)} for {_context(spec, N, K)}")
        dt = _dtype_name(t.dtype)
        if dt not in dtypes:
            raise ValueError(f"{label(key)}: dtype {dt}, expected {' or '.join(dtypes)} "
                             f"(spec {spec.name})")
    for key in ("scales", "zeros"):
        if key not in want and tensors.get(key) is not None:
            raise ValueError(f"{label(key)}: spec {spec.name} has no {key}")
    bias = tensors.get("bias")
    if bias is not None:
        got = tuple(int(d) for d in bias.shape)
        if got != (N,):
            raise ValueError(f"{label('bias')}: shape {list(got)}, expected [{N}] (N)")


# --- helpers -------------------------------------------------------------------------------

def _arr(state: Mapping, key: str):
    v = state.get(key)
    return None if v is None else np.asarray(v)


def _as_int32(x: np.ndarray) -> np.ndarray:
    """int32 containers may be saved as uint32: same bits, the kernels' dtype."""
    return np.ascontiguousarray(x.view(np.int32) if x.dtype == np.uint32 else x)


def _floats(x: np.ndarray) -> np.ndarray:
    """float32 values of a float array or of bfloat16 bits (np.uint16)."""
    x = np.asarray(x)
    return nx.bf16_bits_to_f32(x) if x.dtype == np.uint16 else x.astype(np.float32)


def _check_group(spec: Spec, group: int, what: str) -> None:
    want = spec.b.scale.group
    if group != want:
        per = "per-channel (group -1)" if group in (-1, 0, None) else f"group {group}"
        raise ValueError(f"{what}: a {per} checkpoint, but spec {spec.name} has group {want}; "
                         f"write a spec with scale.group: {group} (see docs/spec.md) to load it")


def _with_bias(out: Dict, state: Mapping) -> Dict:
    b = _arr(state, "bias")
    if b is not None:
        out["bias"] = b
    return out


# --- GPTQ ----------------------------------------------------------------------------------

def _check_g_idx(g_idx, K: int, group: int) -> None:
    """The kernels read the scale of group k // G for row k; act-order
    (desc_act=True) checkpoints assign groups by a permutation instead."""
    if g_idx is None:
        return
    g = np.asarray(g_idx).astype(np.int64)
    if g.shape != (K,):
        raise ValueError(f"g_idx: shape {list(g.shape)}, expected [{K}] (K)")
    trivial = np.arange(K) // group
    if np.array_equal(g, trivial):
        return
    bad = int(np.flatnonzero(g != trivial)[0])
    raise ValueError(
        f"g_idx: act-order (desc_act=True) checkpoint: row k={bad} is in group {int(g[bad])}, "
        f"not k // {group} = {int(trivial[bad])}; opgen's kernels need g_idx[k] == k // {group}. "
        f"Re-quantize with desc_act=False (or static_groups=True)")


def from_gptq(state: Mapping, version: int, N: int, K: int, group: int = 128,
              spec: Union[Spec, str, None] = None) -> Dict[str, np.ndarray]:
    """GPTQ (AutoGPTQ / GPTQModel) 4-bit layer: qweight int32 [K/8, N],
    qzeros int32 [K/G, N/8] (format v1 stores z - 1, v2 stores z), scales
    float16 [K/G, N], optional g_idx [K] (must be k // G) and bias [N].
    The shipped gptq_v{1,2}_w4a16_g128 specs (FORMATS) store exactly this;
    spec= any spec storing the same weight another way (e.g. the *_repacked
    ones) gets it moved there by codegen.transcode."""
    if version not in (1, 2):
        raise ValueError(f"version: GPTQ checkpoint format {version!r}, expected 1 or 2")
    stored = as_spec(FORMATS[f"gptq_v{version}"])          # the checkpoint's storage
    spec = as_spec(spec or stored)
    _check_group(spec, group, "group")
    t = {"qweight": _arr(state, "qweight"), "scales": _arr(state, "scales"),
         "zeros": _arr(state, "qzeros"), "bias": _arr(state, "bias")}
    stored = _with_group(stored, group)
    validate_tensors(stored, t, N, K, names={"zeros": "qzeros"})
    _check_g_idx(state.get("g_idx"), K, group)
    out = {"qweight": _as_int32(t["qweight"]), "scales": np.ascontiguousarray(t["scales"]),
           "zeros": _as_int32(t["zeros"])}
    return _with_bias(_moved(stored, spec, out, N, K), state)


def _with_group(spec: Spec, group: int) -> Spec:
    """The checkpoint format's spec with the checkpoint's scale group (which
    _check_group has matched with the target spec's)."""
    if group == spec.b.scale.group:
        return spec
    return dataclasses.replace(spec, name=f"{spec.name} with group {group}", b=dataclasses.replace(
        spec.b, scale=dataclasses.replace(spec.b.scale, group=group)))


def _moved(stored: Spec, spec: Spec, tensors: Dict[str, np.ndarray], N: int, K: int) -> Dict:
    """Tensors in `stored`'s storage -> `spec`'s (codegen.transcode), with a
    message naming both specs when spec does not hold the same weight."""
    if spec == stored:
        return tensors
    try:
        return transcode(stored, spec, tensors, N, K)
    except TranscodeError as e:
        raise ValueError(f"spec: {spec.name} does not store this checkpoint's weight ({e})") from None


# --- AWQ -----------------------------------------------------------------------------------

def from_awq(state: Mapping, N: int, K: int, group: int = 128,
             spec: Union[Spec, str, None] = None) -> Dict[str, np.ndarray]:
    """AutoAWQ GEMM layer: qweight int32 [K, N/8] and qzeros int32 [K/G, N/8],
    both packed along n in order 0,2,4,6,1,3,5,7; scales float16 [K/G, N];
    optional bias. The shipped awq_w4a16_g128 spec stores exactly this;
    spec= another storage of the same weight gets it moved there."""
    stored = as_spec(FORMATS["awq"])
    spec = as_spec(spec or stored)
    _check_group(spec, group, "group")
    stored = _with_group(stored, group)
    t = {"qweight": _arr(state, "qweight"), "scales": _arr(state, "scales"),
         "zeros": _arr(state, "qzeros"), "bias": _arr(state, "bias")}
    validate_tensors(stored, t, N, K, names={"zeros": "qzeros"})
    out = {"qweight": _as_int32(t["qweight"]), "scales": np.ascontiguousarray(t["scales"]),
           "zeros": _as_int32(t["zeros"])}
    return _with_bias(_moved(stored, spec, out, N, K), state)


# --- bitsandbytes NF4 ----------------------------------------------------------------------

_BNB_NESTED = ("nested_absmax", "nested_quant_map", "nested_blocksize", "nested_offset", "nested_dtype")


def _bnb_fields(state: Mapping) -> Dict:
    """Accept both the plain form {weight, absmax, shape|quant_shape, blocksize}
    and what bnb's Linear4bit.state_dict() writes: weight, weight.absmax,
    weight.quant_map, weight.quant_state.bitsandbytes__nf4 (a uint8 tensor of
    JSON with shape, blocksize, quant_type, dtype and the nested_* fields)."""
    st = {}
    for k, v in state.items():
        st[k[len("weight."):] if k.startswith("weight.") else k] = v
    for k in list(st):
        if k.startswith("quant_state.bitsandbytes__"):
            packed = st.pop(k)
            try:
                meta = json.loads(bytes(np.asarray(packed, dtype=np.uint8).reshape(-1)).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"weight.{k}: not bitsandbytes' packed JSON quant state ({e})")
            meta.setdefault("quant_type", k[len("quant_state.bitsandbytes__"):])
            for mk, mv in meta.items():
                st.setdefault(mk, mv)
    if "shape" not in st and "quant_shape" in st:
        st["shape"] = st["quant_shape"]
    return st


def from_bnb_nf4(state: Mapping, N: int, K: int,
                 spec: Union[Spec, str, None] = None) -> Dict[str, np.ndarray]:
    """bitsandbytes Params4bit, quant_type nf4 (or fp4, given a codebook spec
    of its table: opgen.hf_checkpoint makes one), no double quantization:
    weight uint8 (any shape, N*K/2 bytes; the flat [N, K] codes two per byte,
    even index in the high nibble) and absmax float32 (one per block of
    `blocksize` flat elements). Blocks must not straddle rows (K % blocksize
    == 0), so absmax is the [N, K/blocksize] scale the bnb_nf4 spec stores."""
    spec = as_spec(spec or FORMATS["bnb_nf4"])
    st = _bnb_fields(state)
    if any(k in st for k in _BNB_NESTED):
        raise ValueError("absmax: double-quantized (nested absmax, bnb_4bit_use_double_quant=True) "
                         "checkpoints are not supported; save with bnb_4bit_use_double_quant=False")
    qt = st.get("quant_type", "nf4")
    want = "nf4" if spec.b.dtype == "nf4" else "fp4"     # fp4: a codebook spec of bnb's FP4 table
    if qt != want:
        raise ValueError(f"quant_type: {qt!r}, expected {want!r} (spec {spec.name})")
    for key in ("weight", "absmax", "shape", "blocksize"):
        if st.get(key) is None:
            raise ValueError(f"{key}: missing from the bitsandbytes NF4 state "
                             f"(need weight, absmax, shape, blocksize)")
    shape = tuple(int(d) for d in np.asarray(st["shape"]).reshape(-1))
    if shape != (N, K):
        raise ValueError(f"shape: quant state says {list(shape)}, expected [N, K] = [{N}, {K}]")
    bs = int(np.asarray(st["blocksize"]))
    if bs != spec.b.scale.group:
        raise ValueError(f"blocksize: {bs}, but spec {spec.name} has group {spec.b.scale.group}")
    if K % bs:
        raise ValueError(f"blocksize: {bs} does not divide K={K}, so blocks straddle rows")
    weight, absmax = np.asarray(st["weight"]), np.asarray(st["absmax"])
    if absmax.dtype == np.uint8:
        raise ValueError("absmax: uint8, i.e. double-quantized (bnb_4bit_use_double_quant=True); "
                         "not supported, save with bnb_4bit_use_double_quant=False")
    if weight.size * 2 != N * K:
        raise ValueError(f"weight: {weight.size} bytes, expected N*K/2 = {N * K // 2}")
    if absmax.size * bs != N * K:
        raise ValueError(f"absmax: {absmax.size} values, expected N*K/blocksize = {N * K // bs}")
    qmap = st.get("quant_map")
    table = NF4_TABLE if spec.b.dtype == "nf4" else spec.b.codebook
    # atol: bitsandbytes' CPU backend keeps the FP4 table to 4 decimals
    if qmap is not None and not np.allclose(_floats(qmap), table, rtol=0, atol=1e-4):
        raise ValueError(f"quant_map: not the code table of spec {spec.name} ({spec.b.dtype})")
    t = {"qweight": weight.reshape(N, K // 2), "scales": absmax.reshape(N, K // bs)}
    validate_tensors(spec, t, N, K, names={"qweight": "weight", "scales": "absmax"})
    out = {k: np.ascontiguousarray(v) for k, v in t.items()}
    return _with_bias(out, st)


# --- BitNet (HF transformers) --------------------------------------------------------------

# HF BitLinear's codes: uint8 [N/4, K], byte [i, k] holding rows i, i + N/4,
# i + N/2, i + 3N/4 in its fields 0..3 (four planes of rows).
HF_BITNET_PACK = Pack("uint8", "n", (0, 1, 2, 3), planes=True)


def from_bitnet_hf(state: Mapping, N: int, K: int,
                   spec: Union[Spec, str, None] = None) -> Dict[str, np.ndarray]:
    """HF transformers BitLinear: weight uint8 [N/4, K], packed along dim 0 in
    four row blocks (bit field j of packed[i] holds row i + j*N/4, as value + 1)
    and weight_scale [1], which *divides* (y = (x_q @ t^T) / (x_scale *
    weight_scale)), so W = t / weight_scale.

    That is `spec`'s weight stored in HF_BITNET_PACK (planes of rows), so the
    codes move to spec's storage by codegen.transcode; the scale becomes
    1 / weight_scale in float32 (exact: for t in {-1, 0, 1}, t * fl(1/s) ==
    fl(t/s))."""
    spec = as_spec(spec or FORMATS["bitnet_hf"])
    weight, ws = _arr(state, "weight"), _arr(state, "weight_scale")
    if weight is None:
        raise ValueError("weight: missing; HF BitNet stores it as [N/4, K] uint8")
    if ws is None:
        raise ValueError("weight_scale: missing; HF BitNet stores one value [1]")
    if N % 4:
        raise ValueError(f"weight: N={N} is not a multiple of 4 (HF BitNet packs 4 rows per byte)")
    if weight.shape != (N // 4, K):
        raise ValueError(f"weight: shape {list(weight.shape)}, expected [{N // 4}, {K}] = [N/4, K] "
                         f"(HF BitNet packs 4 rows per byte along dim 0) for N={N}, K={K}")
    if weight.dtype != np.uint8:
        raise ValueError(f"weight: dtype {weight.dtype}, expected uint8")
    if ws.size != 1:
        raise ValueError(f"weight_scale: {ws.size} values, expected 1 (per tensor)")
    s = _floats(ws).reshape(())
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"weight_scale: {float(s)} is not a positive finite number")
    # A field of 3 (both bits set) is no ternary code (HF stores value + 1 in 0..2).
    bad = (weight & (weight >> 1) & 0x55) != 0
    if bad.any():
        i, k = (int(v[0]) for v in np.nonzero(bad))
        j = next(j for j in range(4) if (weight[i, k] >> (2 * j)) & 3 == 3)
        raise ValueError(f"weight: 2-bit field 3 (row {j * N // 4 + i}, column {k}) is not a "
                         f"ternary code (HF BitNet stores value + 1 in 0..2)")
    scales = np.array([np.float32(1.0) / s.astype(np.float32)], np.float32)
    hf = dataclasses.replace(spec, name="bitnet_hf", b=dataclasses.replace(spec.b, layout="nt",
                                                                            pack=HF_BITNET_PACK))
    out = _moved(hf, spec, {"qweight": np.ascontiguousarray(weight), "scales": scales}, N, K)
    validate_tensors(spec, out, N, K)
    return _with_bias(out, state)


# --- dispatch ------------------------------------------------------------------------------

def convert(fmt: str, state: Mapping, N: int, K: int, **kw) -> Tuple[Spec, Dict[str, np.ndarray]]:
    """(spec, tensors) for one layer of checkpoint format `fmt` (a FORMATS key)."""
    if fmt == "gptq_v1" or fmt == "gptq_v2":
        tensors = from_gptq(state, int(fmt[-1]), N, K, **kw)
    elif fmt == "awq":
        tensors = from_awq(state, N, K, **kw)
    elif fmt == "bnb_nf4":
        tensors = from_bnb_nf4(state, N, K, **kw)
    elif fmt == "bitnet_hf":
        tensors = from_bitnet_hf(state, N, K, **kw)
    else:
        raise ValueError(f"format {fmt!r}: unknown (known: {', '.join(FORMATS)})")
    return as_spec(kw.get("spec") or FORMATS[fmt]), tensors
