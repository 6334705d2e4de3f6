"""A quantized Hugging Face checkpoint directory -> a transformers model whose
quantized linear layers run on opgen (QuantLinear), and a report of what runs where.

    from opgen.hf_checkpoint import load_quantized
    model, report = load_quantized("Llama-3-8B-GPTQ/", device="cuda")
    print(report)         # the layers on opgen (and their spec), the others and why

Optional front end: needs transformers and safetensors (`pip install
'opgen[hf]'`); `import opgen` and opgen.torch never import it.

The directory holds config.json (with `quantization_config`) and
model.safetensors, or shards named by model.safetensors.index.json. The model
is built from the config with its parameters on the meta device, each
quantized nn.Linear is replaced by a QuantLinear holding that layer's tensors
as the checkpoint stores them (opgen.checkpoints validates them; the layer
moves them into the kernels' layout), and every other tensor is loaded as
transformers would, cast to `dtype`. Formats (quant_method; read by
opgen.hf_formats):

  gptq                v1 / v2 (checkpoint_format), 4-bit, any group (-1: one group
                      of K); desc_act: rows of K sorted by group, the input gathered
                      to match (PermutedInput; exact)
  awq                 version gemm, 4-bit, with zero points
  bitsandbytes        4-bit nf4 and fp4 (a codebook spec of bnb's table), serialized
                      with their quant state, no double quantization
  compressed-tensors  pack-quantized int4 / int8, group or channel, symmetric or with
                      zero points (user specs of its layout)
  mxfp4               gpt-oss: its experts are fused [experts, K, N] parameters, not
                      nn.Linear: dequantized to float (reported)
  bitnet              HF BitLinear (offline, packed): activations quantized to int8
                      per token as BitLinear does (bitnet_b158_a8), or with
                      bitnet_activations="float" kept in `dtype` (bitnet_b158)

A quantized layer the kernels cannot run (the alignment rules of
docs/spec.md, act-order groups of unequal size) holds its dequantized weight
in an nn.Linear, with the reason in the report. Bad input raises
CheckpointError naming the file, the tensor or config field, and the mismatch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import transformers
from safetensors import SafetensorError, safe_open
from torch import nn

from .codegen import reference as R
from .codegen.planner import PlanError, check_shape
from .codegen.resolve import as_spec
from .hf_formats import BITNET_SPECS, FORMATS, CheckpointError, Format, NotServed, Target
from .model_shapes import read_json_object
from .torch import QuantLinear, fuse_siblings, stack_refusal, to_numpy, to_torch

__all__ = ["load_quantized", "LoadReport", "CheckpointError", "PermutedInput"]


@dataclass
class LoadReport:
    format: str                                                  # e.g. "gptq v2, 4-bit, group 128"
    served: Dict[str, str] = field(default_factory=dict)         # layer -> spec it runs on opgen
    dequantized: Dict[str, str] = field(default_factory=dict)    # quantized, runs in float: why
    unquantized: List[str] = field(default_factory=list)         # float in the checkpoint
    unused: List[str] = field(default_factory=list)              # tensors no module takes
    fused: List[Tuple[str, ...]] = field(default_factory=list)   # siblings run as one layer (fuse)
    notes: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        by_spec: Dict[str, int] = {}
        for spec in self.served.values():
            by_spec[spec] = by_spec.get(spec, 0) + 1
        lines = [f"format: {self.format}",
                 f"{len(self.served)} layer(s) run on opgen"
                 + "".join(f"; {n} with spec {s}" for s, n in by_spec.items())]
        if self.dequantized:
            lines.append(f"{len(self.dequantized)} quantized layer(s) run in float:")
            lines += [f"  {name}: {why}" for name, why in self.dequantized.items()]
        if self.unquantized:
            lines.append(f"{len(self.unquantized)} layer(s) float in the checkpoint: "
                         + ", ".join(self.unquantized))
        if self.unused:
            lines.append(f"{len(self.unused)} tensor(s) unused: " + ", ".join(self.unused))
        if self.fused:
            lines.append(f"{len(self.fused)} group(s) of siblings run as one layer each, e.g. "
                         + " + ".join(self.fused[0]))
        return "\n".join(lines + self.notes)


class PermutedInput(nn.Module):
    """A layer fed its input's columns in the order `perm`: act-order
    (desc_act) weights with their rows of K sorted by group, so that row k
    takes the scale of group k // G as the kernels read it. The same weights
    and products, summed in another order."""

    def __init__(self, layer: nn.Module, perm: torch.Tensor):
        super().__init__()
        self.layer = layer
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.register_buffer("perm", perm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.index_select(-1, self.perm))


# --- the directory ---------------------------------------------------------------------------

def _json(path: Path) -> dict:
    return read_json_object(path, CheckpointError)


class _Files:
    """The checkpoint's tensors: name -> its safetensors file, read on demand."""

    def __init__(self, root: Path):
        index = root / "model.safetensors.index.json"
        self._open: Dict[Path, object] = {}
        if index.is_file():
            weight_map = _json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: weight_map: missing or empty")
            self.file_of = {name: root / f for name, f in weight_map.items()}
            for f in dict.fromkeys(self.file_of.values()):
                held = set(self._handle(f, index).keys())
                lost = [n for n, g in self.file_of.items() if g == f and n not in held]
                if lost:
                    raise CheckpointError(f"{f}: {lost[0]}: not in the file ({len(lost)} tensor(s) "
                                          f"{index.name} places there are not)")
        else:
            single = root / "model.safetensors"
            if not single.is_file():
                raise CheckpointError(f"{root}: no model.safetensors nor model.safetensors.index.json")
            self.file_of = {name: single for name in self._handle(single).keys()}

    def _handle(self, f: Path, named_by: Optional[Path] = None):
        h = self._open.get(f)
        if h is None:
            if not f.is_file():
                by = f" (named by {named_by.name})" if named_by else ""
                raise CheckpointError(f"{f}: no such file{by}")
            try:
                h = self._open[f] = safe_open(str(f), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
        return h

    def get(self, name: str, device=None) -> torch.Tensor:
        t = self._handle(self.file_of[name]).get_tensor(name)
        return t if device is None else t.to(device)


def _error(files: _Files, prefix: str, local: Mapping[str, str], e: Exception) -> CheckpointError:
    """A conversion's ValueError ('qzeros: shape ...', naming the layer's own
    tensor) as a CheckpointError naming the file and the full tensor name."""
    msg = str(e)
    head = msg.split(":", 1)[0]
    if head not in local and "weight." + head in local:     # bitsandbytes' weight.absmax & co.
        head, msg = "weight." + head, "weight." + msg
    key = local.get(head, next(iter(local.values())))
    return CheckpointError(f"{files.file_of[key]}: {prefix}{msg}")


# --- the model -------------------------------------------------------------------------------

@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built here get their parameters on the meta device (filled
    from the checkpoint later) and their buffers for real: buffers the
    checkpoint does not hold (rotary inv_freq) are computed at init."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=False)
    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _empty_model(config: Mapping, src: str, dtype) -> nn.Module:
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    model_type = cfg.pop("model_type", None)
    if not isinstance(model_type, str):
        raise CheckpointError(f"{src}: model_type: missing")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{src}: model_type: {model_type!r}: {e}") from None
    with _parameters_on_meta():
        try:
            return transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        except ValueError as e:
            raise CheckpointError(f"{src}: model_type: {model_type!r}: {e}") from None


def _set(model: nn.Module, key: str, t: torch.Tensor) -> None:
    parent, _, attr = key.rpartition(".")
    mod = model.get_submodule(parent) if parent else model
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(t, requires_grad=False)
    else:
        mod._buffers[attr] = t


def _float_linear(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> nn.Linear:
    N, K = weight.shape
    lin = nn.Linear(K, N, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


def _quantized_layer(fmt: Format, name: str, mod: nn.Linear, files: _Files, local: Dict[str, str],
                     dtype, device, pdl: bool) -> Tuple[nn.Module, Optional[str], Optional[str]]:
    """(module, spec name or None, why not served or None) of one quantized
    Linear (pdl: QuantLinear's)."""
    N, K = mod.out_features, mod.in_features
    st = {k: files.get(full) for k, full in local.items()}
    bias = st.pop("bias", None)
    if (bias is None) != (mod.bias is None):
        f = files.file_of[next(iter(local.values()))]
        raise CheckpointError(f"{f}: {name}.bias: " + ("missing; the model's layer has a bias (config.json)"
                                                       if bias is None else "the model's layer has no bias"))
    if bias is not None and tuple(bias.shape) != (N,):
        raise CheckpointError(f"{files.file_of[local['bias']]}: {name}.bias: shape "
                              f"{list(bias.shape)}, expected [{N}]")
    try:
        layer = fmt.convert(name, mod, st, N, K)
        check_shape(layer.spec, N, K)
    except NotServed as e:
        weight, why = torch.from_numpy(e.weight), str(e)
    except PlanError as e:                   # the kernels' alignment rules
        weight = torch.from_numpy(R.dequantize(layer.spec, layer.tensors, N, K))
        why = f"{layer.spec.name}: {e}"
    except CheckpointError:
        raise
    except ValueError as e:                  # the tensors are not what the format stores
        raise _error(files, name + ".", local, e) from None
    else:
        # on the target device first: QuantLinear moves them into the kernels' layout there
        tensors = {k: to_torch(v, device) for k, v in layer.tensors.items()}
        q = QuantLinear(layer.spec, K, N, bias=bias, device=device, pdl=pdl, **tensors)
        if layer.perm is None:
            return q, layer.spec.name, None
        return PermutedInput(q, torch.from_numpy(layer.perm).to(device)), layer.spec.name, None
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    return _float_linear(weight.to(device=device, dtype=dtype), bias), None, why


def _experts(fmt: Format, model: nn.Module, files: _Files, report: LoadReport, dtype, device) -> set:
    """MXFP4 expert parameters (gpt-oss): X_blocks [E, N, K/32, 16] and X_scales
    [E, N, K/32] -> the float parameter X [E, K, N] (x @ W, as transformers
    holds gpt-oss's experts), each expert dequantized by the mxfp4 spec."""
    used = set()
    spec = as_spec("mxfp4")
    for key in [k for k in files.file_of if k.endswith(fmt.expert_suffixes[0])]:
        pname = key[: -len(fmt.expert_suffixes[0])]
        skey = pname + fmt.expert_suffixes[1]
        if skey not in files.file_of:
            raise CheckpointError(f"{files.file_of[key]}: {skey}: missing (the scales of {key})")
        blocks, scales = to_numpy(files.get(key)), to_numpy(files.get(skey))
        try:
            param = model.get_parameter(pname)
        except AttributeError:
            raise CheckpointError(f"{files.file_of[key]}: {key}: the model has no parameter "
                                  f"{pname}") from None
        if blocks.ndim != 4 or blocks.dtype != np.uint8 or blocks.shape[-1] != 16:
            raise CheckpointError(f"{files.file_of[key]}: {key}: shape {list(blocks.shape)} "
                                  f"{blocks.dtype}, expected [E, N, K/32, 16] uint8")
        E, N, kb, _ = blocks.shape
        K = kb * 32
        if tuple(scales.shape) != (E, N, kb) or scales.dtype != np.uint8:
            raise CheckpointError(f"{files.file_of[skey]}: {skey}: shape {list(scales.shape)} "
                                  f"{scales.dtype}, expected [{E}, {N}, {kb}] = [E, N, K/32] uint8")
        if tuple(param.shape) != (E, K, N):
            raise CheckpointError(f"{files.file_of[key]}: {key}: holds [{E}, {N}, {K}] experts, but "
                                  f"the model's {pname} is {list(param.shape)} (expected [E, K, N])")
        w = np.empty((E, K, N), np.float32)
        for e in range(E):
            w[e] = R.dequantize(spec, {"qweight": blocks[e].reshape(N, K // 2), "scales": scales[e]}, N, K).T
        _set(model, pname, torch.from_numpy(w).to(device=device, dtype=dtype))
        used |= {key, skey}
        report.dequantized[pname] = ("mxfp4 experts: a fused [experts, K, N] parameter, not nn.Linear: "
                                     "dequantized to float")
    return used


def load_quantized(path: Union[str, Path], device=None, dtype: torch.dtype = torch.float16,
                   bitnet_activations: str = "int8", fuse: Optional[bool] = None,
                   pdl: bool = False) -> Tuple[nn.Module, LoadReport]:
    """(model, report) of a quantized checkpoint directory (see the module's
    doc): the model in eval mode on `device` (default CPU, where QuantLinear
    runs the numpy reference), float tensors in `dtype`. bitnet_activations:
    "int8" (BitNet's own recipe) or "float" (hf_formats.BITNET_SPECS). fuse:
    the served siblings that read the same input (q / k / v, gate / up) as
    one stacked layer each (opgen.torch.fuse_siblings; the report's `fused`);
    None (the default): where their spec stacks (decode measured faster:
    docs/performance.md#whole-model-decode); True: the same, and the report
    notes each spec that does not stack.
    pdl: the served layers' kernels launched for programmatic dependent
    launch (QuantLinear's; sm_90)."""
    if bitnet_activations not in BITNET_SPECS:
        raise ValueError(f"bitnet_activations: {bitnet_activations!r}, expected one of "
                         f"{', '.join(BITNET_SPECS)}")
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (give a checkpoint directory)")
    src = root / "config.json"
    config = _json(src)
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        raise CheckpointError(f"{src}: quantization_config: missing (not a quantized checkpoint)")
    method = q.get("quant_method")
    if method not in FORMATS:
        raise CheckpointError(f"{src}: quantization_config.quant_method: {method!r}; opgen loads "
                              + ", ".join(FORMATS))
    fmt = FORMATS[method](q, str(src), Target(dtype, bitnet_activations))
    files = _Files(root)
    model = _empty_model(config, str(src), dtype)
    report = LoadReport(fmt.name, notes=list(fmt.notes))

    # each Linear's tensors, by the layer's own names
    linears = {name: mod for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    local: Dict[str, Dict[str, str]] = {}
    for key in files.file_of:
        for i in range(len(key)):
            if key[i] == "." and key[:i] in linears:
                local.setdefault(key[:i], {})[key[i + 1:]] = key
                break
    used = set()
    for name, mod in linears.items():
        mine = local.get(name, {})
        if fmt.marker not in mine:
            if "weight" in mine:
                report.unquantized.append(name)
            continue
        new, spec, why = _quantized_layer(fmt, name, mod, files, mine, dtype, device, pdl)
        model.set_submodule(name, new)
        if spec is not None:
            report.served[name] = spec
        else:
            report.dequantized[name] = why
        used |= set(mine.values())
    if fmt.expert_suffixes:
        used |= _experts(fmt, model, files, report, dtype, device)
    if not report.served and not report.dequantized:
        raise CheckpointError(f"{src}: quantization_config says {method}, but no layer of the "
                              f"checkpoint has its tensors ({fmt.marker})")

    # everything else, as transformers would load it
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers(remove_duplicate=False))
    for key in files.file_of:
        if key in used:
            continue
        if key not in targets:
            report.unused.append(key)
            continue
        t, want = files.get(key), targets[key]
        if tuple(t.shape) != tuple(want.shape):
            raise CheckpointError(f"{files.file_of[key]}: {key}: shape {list(t.shape)}, expected "
                                  f"{list(want.shape)} (the model config.json describes)")
        if t.is_floating_point() != want.is_floating_point():
            raise CheckpointError(f"{files.file_of[key]}: {key}: dtype {t.dtype}, expected {want.dtype}")
        _set(model, key, t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype))
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise CheckpointError(f"{root}: {missing[0]}: missing (no file of the checkpoint holds it"
                              + (f"; {len(missing) - 1} more" if len(missing) > 1 else "") + ")")
    if device is not None:
        model.to(device)
    if fuse is not False:
        # (fuse_siblings leaves the layers of such specs as they are; act-order's
        # PermutedInput layers are no QuantLinears and never stacked)
        if fuse:
            refused = {stack_refusal(m.kernel_spec) for m in map(model.get_submodule, report.served)
                       if isinstance(m, QuantLinear)}
            report.notes += [f"{why}: its siblings stay separate layers" for why in sorted(refused - {None})]
        report.fused = fuse_siblings(model, list(report.served))
    return model.eval(), report
