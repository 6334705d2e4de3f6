"""What a Hugging Face `quantization_config` says, layer by layer: each
quantized linear's checkpoint tensors -> (spec, tensors in its storage) for
QuantLinear; the loader of checkpoint directories is opgen.hf_checkpoint.

FORMATS maps a quant_method to its reader: reader(quantization_config,
config file, Target: the model's dtype and BitNet's activations) -> Format,
whose convert(name, module, tensors, N, K) takes one layer's tensors
(torch, by the layer's own names: "qweight", "weight.absmax",
"weight_packed", ...) and returns a Layer, raises
ValueError naming the tensor that is not what the format stores, or
NotServed (a layer no spec and order of K can hold: its float weight).
Specs are the shipped ones where they match, else user specs derived here
(another scale group, bfloat16 activations, compressed-tensors' layouts,
bitsandbytes' FP4 table), validated like any spec. A config this module
cannot load raises CheckpointError naming the file and the field.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

from . import checkpoints as ck
from .codegen import reference as R
from .codegen.canonical import spec_to_yaml_dict
from .codegen.errors import SpecErrors, UserError
from .codegen.resolve import as_spec
from .codegen.spec import A8_DTYPES, Spec
from .codegen.storage import decode_storage, encode_codes
from .codegen.validate import spec_from_dict
from .torch import to_numpy

__all__ = ["FORMATS", "Format", "Layer", "NotServed", "CheckpointError", "BNB_FP4"]

# bitsandbytes' FP4 code table (bitsandbytes.functional.get_4bit_type("fp4")): the
# values of its 2-exponent-bit, 1-mantissa-bit codes, normalized by the largest (12)
BNB_FP4 = tuple(float(np.float32(v / 12)) for v in
                (0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0, -0.0625, -8, -12, -4, -6, -2, -3))


class CheckpointError(UserError):
    """A checkpoint directory opgen cannot load: the message names the file,
    the tensor or config field, and what is wrong."""


class NotServed(Exception):
    """A quantized layer the kernels cannot run: .weight is its float [N, K]."""

    def __init__(self, why: str, weight: np.ndarray):
        super().__init__(why)
        self.weight = weight


@dataclass
class Layer:
    spec: Spec
    tensors: Dict[str, np.ndarray]          # qweight, scales, zeros in spec's storage
    perm: Optional[np.ndarray] = None       # act-order: the input's column order


@dataclass
class Format:
    name: str
    marker: str                             # the tensor that marks a layer quantized
    convert: Callable                       # (name, module, tensors, N, K) -> Layer
    notes: Tuple[str, ...] = ()
    expert_suffixes: Tuple[str, ...] = ()   # quantized non-Linear parameters (mxfp4)


# --- specs -----------------------------------------------------------------------------------

_SPECS: Dict[str, Spec] = {}


def _user_spec(d: dict, field_: str) -> Spec:
    """A spec made here (validated like any user spec), once per content."""
    key = json.dumps(d, sort_keys=True)
    if key not in _SPECS:
        try:
            _SPECS[key] = spec_from_dict(d)
        except SpecErrors as e:
            raise CheckpointError(f"{field_}: opgen's spec for it is not valid: {e}") from None
    return _SPECS[key]


# How BitNet layers take their input (Target.bitnet_activations): int8 per
# token as BitLinear does (W1.58A8, the authors' recipe), or the model's float
# dtype (W1.58A16).
BITNET_SPECS = {"int8": "bitnet_b158_a8", "float": "bitnet_b158"}


@dataclass(frozen=True)
class Target:
    """What the loaded model runs in: its float dtype, and how BitNet layers
    take their input (a key of BITNET_SPECS)."""
    dtype: torch.dtype = torch.float16
    bitnet_activations: str = "int8"


def _variant(base: str, dtype: torch.dtype, src: str, group: Optional[int] = None) -> Spec:
    """A shipped spec with the checkpoint's scale group and the model's
    activation dtype (bfloat16 models: bfloat16 activations, unless 8-bit,
    and output)."""
    spec = as_spec(base)
    bf16 = dtype == torch.bfloat16
    if (group is None or group == spec.b.scale.group) and not bf16:
        return spec
    d = spec_to_yaml_dict(spec)
    name = base
    if group is not None and group != spec.b.scale.group:
        d["b"]["scale"]["group"] = group
        name = re.sub(r"_g\d+$", "", base) + f"_g{group}"
        d["description"] = f"{spec.description} With scale group {group} (opgen.hf_formats)."
    if bf16:
        d["out"]["dtype"] = "bfloat16"
        if spec.a.dtype not in A8_DTYPES:      # 8-bit activations stay: the layer quantizes x
            d["a"]["dtype"] = "bfloat16"
        name += "_bf16"
    d["name"] = name
    return _user_spec(d, f"{src}: quantization_config.group_size")


def _activations(d: dict, dtype: torch.dtype) -> dict:
    act = "bfloat16" if dtype == torch.bfloat16 else "float16"
    d.update(a={"dtype": act}, out={"dtype": act})
    if act == "bfloat16":
        d["name"] += "_bf16"
    return d


# --- act-order -------------------------------------------------------------------------------

def _act_order(g_idx, spec: Spec, t: Dict, N: int, K: int) -> Optional[np.ndarray]:
    """None when g_idx (a group per row of K) is k // G; else the permutation
    of K that makes it so, with t's codes moved to match; NotServed when no
    permutation can (groups of unequal size)."""
    G = spec.b.scale.group
    g = np.asarray(g_idx).astype(np.int64)
    if g.shape != (K,):
        raise ValueError(f"g_idx: shape {list(g.shape)}, expected [{K}] (K)")
    trivial = np.arange(K) // G
    if np.array_equal(g, trivial):
        return None
    perm = np.argsort(g, kind="stable")
    if not np.array_equal(g[perm], trivial):
        if g.min() < 0 or g.max() >= K // G:
            raise ValueError(f"g_idx: groups {int(g.min())}..{int(g.max())}, expected 0..{K // G - 1}")
        w = spec.b
        q = R.code_values(w, decode_storage(w, t["qweight"]))
        s = R.scale_logical(w, t, N, K)[:, g]
        z = R.zero_logical(w, t, N, K)
        weight = (q - (z[:, g] if z.shape[1] > 1 else z)) * s      # GPTQ's (q - z) * s
        raise NotServed(f"act-order (desc_act) groups of unequal size: no order of K gives "
                         f"row k group k // {G}", weight.astype(np.float32))
    t["qweight"] = encode_codes(spec, decode_storage(spec, t["qweight"])[:, perm])
    return perm


# --- the formats -----------------------------------------------------------------------------

def _numpy(st: Mapping[str, torch.Tensor]) -> Dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in st.items()}


def _get(q: Mapping, key: str, src: str, default=None, allowed=None):
    v = q.get(key, default)
    if allowed is not None and v not in allowed:
        raise CheckpointError(f"{src}: quantization_config.{key}: {v!r}; opgen loads "
                              + " or ".join(repr(a) for a in allowed))
    return v


def _group(q: Mapping, src: str, where: str = "quantization_config") -> int:
    g = q.get("group_size", 128)
    if isinstance(g, bool) or not isinstance(g, int) or (g <= 0 and g != -1):
        raise CheckpointError(f"{src}: {where}.group_size: {g!r} is not a positive integer or -1")
    return g


def _gptq(q: Mapping, src: str, target: Target) -> Format:
    _get(q, "bits", src, 4, allowed=(4,))
    version = {"gptq": 1, "gptq_v2": 2}.get(q.get("checkpoint_format") or q.get("format") or "gptq")
    if version is None:
        key = "checkpoint_format" if "checkpoint_format" in q else "format"
        _get(q, key, src, allowed=("gptq", "gptq_v2"))
    group = _group(q, src)

    def convert(name, module, st, N, K):
        spec = _variant(ck.FORMATS[f"gptq_v{version}"], target.dtype, src, K if group == -1 else group)
        st = _numpy(st)
        g_idx = st.pop("g_idx", None)
        _, t = ck.convert(f"gptq_v{version}", st, N, K, group=spec.b.scale.group, spec=spec)
        perm = None if g_idx is None else _act_order(g_idx, spec, t, N, K)
        return Layer(spec, t, perm)
    return Format(f"gptq v{version}, 4-bit, group {group}" + (", act-order" if q.get("desc_act") else ""),
                   "qweight", convert)


def _awq(q: Mapping, src: str, target: Target) -> Format:
    _get(q, "bits", src, 4, allowed=(4,))
    if str(q.get("version", "gemm")).lower() != "gemm":
        raise CheckpointError(f"{src}: quantization_config.version: {q.get('version')!r}; opgen "
                              f"loads AutoAWQ's 'gemm' layout")
    _get(q, "zero_point", src, True, allowed=(True,))
    group = _group(q, src)

    def convert(name, module, st, N, K):
        spec = _variant(ck.FORMATS["awq"], target.dtype, src, K if group == -1 else group)
        return Layer(spec, ck.convert("awq", _numpy(st), N, K, group=spec.b.scale.group, spec=spec)[1])
    return Format(f"awq gemm, 4-bit, group {group}", "qweight", convert)


def _bnb_fp4_spec(blocksize: int, dtype) -> Spec:
    d = spec_to_yaml_dict(as_spec("bnb_nf4"))
    d["name"] = "bnb_fp4" if blocksize == 64 else f"bnb_fp4_g{blocksize}"
    d["description"] = ("bitsandbytes FP4 (Params4bit, quant_type fp4) with float32 absmax per "
                        f"block of {blocksize}, no double quantization (opgen.hf_formats).")
    d["b"].update(dtype="codebook", bits=4, codebook=list(BNB_FP4))
    d["b"]["scale"]["group"] = blocksize
    return _user_spec(_activations(d, dtype), "bnb_4bit_quant_type")


def _bnb(q: Mapping, src: str, target: Target) -> Format:
    if not (q.get("load_in_4bit") or q.get("_load_in_4bit")):
        raise CheckpointError(f"{src}: quantization_config.load_in_4bit: not true; opgen loads "
                              f"bitsandbytes 4-bit checkpoints (not 8-bit LLM.int8)")
    qt = _get(q, "bnb_4bit_quant_type", src, "fp4", allowed=("nf4", "fp4"))
    if q.get("bnb_4bit_use_double_quant"):
        raise CheckpointError(f"{src}: quantization_config.bnb_4bit_use_double_quant: true; opgen "
                              f"loads bitsandbytes 4-bit checkpoints saved without it")

    def convert(name, module, st, N, K):
        absmax = st.get("weight.absmax")
        n = 0 if absmax is None else absmax.numel()
        bs = N * K // n if n and (N * K) % n == 0 else 64    # else: from_bnb_nf4 names the mismatch
        spec = (_variant("bnb_nf4", target.dtype, src, bs) if qt == "nf4"
                else _bnb_fp4_spec(bs, target.dtype))
        return Layer(spec, ck.from_bnb_nf4(_numpy(st), N, K, spec=spec))
    return Format(f"bitsandbytes {qt}", "weight.absmax", convert)


def _ct_spec(w: Mapping, scale_dtype: str, dtype, src: str) -> Spec:
    """compressed-tensors pack-quantized storage: signed codes + 2^(bits-1)
    packed into int32 words along K, first code in the low bits (int8: the
    words' bytes), weight_scale [N, K/G] (channel: [N, 1]), zero points the
    same + 2^(bits-1), packed along N ([N/8, K/G])."""
    bits, sym = w["num_bits"], w.get("symmetric", True)
    channel = w.get("strategy") == "channel"
    code = f"uint{bits}"
    b = {"dtype": code, "layout": "nt",
         "scale": {"dtype": scale_dtype, "group": "channel" if channel else w["group_size"]}}
    if not channel:
        b["scale"]["layout"] = "nk"
    if bits == 4:
        b["pack"] = {"container": "int32", "axis": "k"}
    b["zero"] = ({"kind": "const", "value": 1 << (bits - 1)} if sym else
                 {"kind": "int", "dtype": code, "offset": 0,
                  **({"pack": {"container": "int32", "axis": "n"}} if bits == 4 else {})})
    name = (f"ct_w{bits}a16_{'sym' if sym else 'asym'}_{'channel' if channel else 'g%d' % w['group_size']}"
            + {"bfloat16": "_sbf16", "float32": "_sf32"}.get(scale_dtype, ""))
    d = {"opgen": 1, "name": name, "op": "matmul", "b": b,
         "description": "compressed-tensors pack-quantized (opgen.hf_formats)"}
    return _user_spec(_activations(d, dtype), f"{src}: quantization_config.config_groups")


def _ct_tensors(spec: Spec, st: Dict[str, np.ndarray], N: int, K: int) -> Dict[str, np.ndarray]:
    """weight_packed & co. -> the storage of _ct_spec: int8's words viewed as
    their bytes (little-endian: the first code in the low byte), a channel
    scale [N, 1] as [N]; shapes checked first so that errors name theirs."""
    w, bits = spec.b, 8 if spec.b.dtype == "uint8" else 4
    channel = w.scale.granularity == "channel"
    cols = 1 if channel else K // w.scale.group
    bf16_bits = ("uint16",) if w.scale.dtype == "bfloat16" else ()
    want = {"weight_packed": ((N, K * bits // 32), ("int32",)),
            "weight_scale": ((N, cols), (w.scale.dtype,) + bf16_bits)}
    if w.zero.kind == "int":
        want["weight_zero_point"] = ((-(-N * bits // 32), cols), ("int32",))
    for key, (shape, dtypes) in want.items():
        a = st.get(key)
        if a is None:
            raise ValueError(f"{key}: missing (pack-quantized int{bits}, {w.scale.granularity} "
                             f"scale{'' if w.zero.kind == 'int' else ', symmetric'})")
        if tuple(a.shape) != shape:
            raise ValueError(f"{key}: shape {list(a.shape)}, expected {list(shape)} for N={N}, K={K}")
        if str(a.dtype) not in dtypes:
            raise ValueError(f"{key}: dtype {a.dtype}, expected {dtypes[0]}")
    shape = st.get("weight_shape")
    if shape is not None and [int(v) for v in np.asarray(shape).reshape(-1)] != [N, K]:
        raise ValueError(f"weight_shape: {np.asarray(shape).tolist()}, expected [{N}, {K}]")
    if bits == 8 and w.zero.kind == "int" and N % 4:
        raise ValueError(f"weight_zero_point: N={N} is not a multiple of 4 (4 zero points per word)")
    if bits == 8 and sys.byteorder != "little":
        raise ValueError("weight_packed: int8 codes are read as the words' bytes: little-endian only")
    t = {"qweight": st["weight_packed"], "scales": st["weight_scale"]}
    if bits == 8:
        t["qweight"] = t["qweight"].view(np.uint8)
    if w.zero.kind == "int":
        z = st["weight_zero_point"]
        if bits == 8:   # packed along N, 4 per word: [N/4, cols] words -> [N, cols] bytes
            z = z.view(np.uint8).reshape(N // 4, cols, 4).transpose(0, 2, 1).reshape(N, cols)
        t["zeros"] = z
    if channel:
        t = {k: v.reshape(-1) if k != "qweight" else v for k, v in t.items()}
    t = {k: np.ascontiguousarray(v) for k, v in t.items()}
    ck.validate_tensors(spec, t, N, K, names={"qweight": "weight_packed", "scales": "weight_scale",
                                              "zeros": "weight_zero_point"})
    return t


def _ct_matches(name: str, module: nn.Module, target: str) -> bool:
    """compressed-tensors' target rule: 're:' a regex matched at the start of
    the name, else the name itself or a class name of the module."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or any(c.__name__ == target for c in type(module).__mro__)


def _compressed_tensors(q: Mapping, src: str, target: Target) -> Format:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{src}: quantization_config.config_groups: missing or empty")
    schemes = []
    for gname, g in groups.items():
        where = f"quantization_config.config_groups.{gname}"
        at = f"{src}: {where}"
        fmt = g.get("format") or q.get("format")
        if fmt != "pack-quantized":
            raise CheckpointError(f"{at}.format: {fmt!r}; opgen loads 'pack-quantized'")
        if g.get("input_activations") is not None:
            raise CheckpointError(f"{at}.input_activations: quantized activations; opgen loads "
                                  f"pack-quantized weight-only (W4A16, W8A16) checkpoints")
        w = g.get("weights")
        if not isinstance(w, dict):
            raise CheckpointError(f"{at}.weights: missing")
        for key, allowed in (("type", ("int",)), ("num_bits", (4, 8)), ("strategy", ("group", "channel"))):
            if w.get(key) not in allowed:
                raise CheckpointError(f"{at}.weights.{key}: {w.get(key)!r}; opgen loads "
                                      + " or ".join(repr(a) for a in allowed))
        if w["strategy"] == "group" and _group(w, src, where + ".weights") == -1:
            raise CheckpointError(f"{at}.weights.group_size: -1 with strategy 'group'")
        schemes.append((g.get("targets") or ["Linear"], w))

    def convert(name, module, st, N, K):
        w = next((w for targets, w in schemes if any(_ct_matches(name, module, t) for t in targets)), None)
        if w is None:
            raise ValueError(f"weight_packed: no config group of {src} targets this layer")
        st = _numpy(st)
        scale = st.get("weight_scale")           # its dtype is the spec's (bfloat16 as uint16 bits)
        sdt = "float16" if scale is None else {"uint16": "bfloat16"}.get(str(scale.dtype), str(scale.dtype))
        if sdt not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"weight_scale: dtype {scale.dtype}, expected float16, bfloat16 or float32")
        spec = _ct_spec(w, sdt, target.dtype, src)
        t = _ct_tensors(spec, st, N, K)
        g_idx = st.get("weight_g_idx")
        perm = None if g_idx is None or w["strategy"] != "group" else _act_order(g_idx, spec, t, N, K)
        return Layer(spec, t, perm)
    kinds = sorted({f"int{w['num_bits']} {w['strategy']}" for _, w in schemes})
    return Format(f"compressed-tensors pack-quantized ({', '.join(kinds)})", "weight_packed", convert)


def _mxfp4(q: Mapping, src: str, target: Target) -> Format:
    def convert(name, module, st, N, K):          # no nn.Linear holds *_blocks in gpt-oss
        raise ValueError("weight_blocks: an MXFP4 nn.Linear; opgen loads gpt-oss's MXFP4 experts")
    return Format("mxfp4 (gpt-oss)", "weight_blocks", convert, expert_suffixes=("_blocks", "_scales"))


def _bitnet(q: Mapping, src: str, target: Target) -> Format:
    _get(q, "linear_class", src, "bitlinear", allowed=("bitlinear",))
    _get(q, "quantization_mode", src, "offline", allowed=("offline",))
    if q.get("use_rms_norm"):
        raise CheckpointError(f"{src}: quantization_config.use_rms_norm: true; opgen loads BitLinear "
                              f"layers without their own input RMSNorm")
    acts = target.bitnet_activations
    base = BITNET_SPECS[acts]

    def convert(name, module, st, N, K):
        spec = _variant(base, target.dtype, src)
        return Layer(spec, ck.convert("bitnet_hf", _numpy(st), N, K, spec=spec)[1])
    notes = () if acts == "int8" else (
        f"note: BitLinear quantizes its input to int8 per token; on opgen ({base}) the input "
        f"stays {str(target.dtype).replace('torch.', '')}",)
    return Format(f"bitnet (BitLinear, offline; {acts} activations)", "weight_scale", convert,
                  notes=notes)


FORMATS = {"gptq": _gptq, "awq": _awq, "bitsandbytes": _bnb,
           "compressed-tensors": _compressed_tensors, "mxfp4": _mxfp4, "bitnet": _bitnet}
