"""PyTorch integration: `QuantLinear`, `replace_linear` and the `opgen::matmul` and
`opgen::quantize` ops.

Optional: `import opgen` never imports this module (nor torch).

    from opgen.torch import QuantLinear, replace_linear
    report = replace_linear(model, "gptq_v2_w4a16_g128", skip=["lm_head"])
    layer = QuantLinear.from_checkpoint("gptq_v2", sub_state(sd, "model.layers.0.mlp.up_proj."),
                                        in_features=4096, out_features=11008)

The matmul is a `torch.library` custom op (`torch.ops.opgen.matmul`) with a
fake implementation (as is the per-row quantizer of 8-bit-activation specs,
`torch.ops.opgen.quantize`), so models using QuantLinear trace under torch.compile and
capture into CUDA graphs. Custom ops take only tensors and scalars, so the
(spec, N, K) of each call is an int handle into a process-wide registry; the
compiled MatmulOp behind a handle is built on first use and shared by every
layer of the same spec and shape.

CUDA tensors run the generated kernels. CPU tensors run the numpy reference
(`codegen.reference`: exact and slow; for tests and debugging). Float weights
are quantized where they lie (`QuantLinear.from_linear`, `replace_linear`): on
the GPU by CuPy, on the CPU by numpy, the same bytes either way.
"""
import fnmatch
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from . import checkpoints as ck
from .checkpoints import n_axes, stack_refusal
from .codegen import quantize_weight
from .codegen import reference as R
from .codegen.planner import PlanError, check_shape, execution_spec
from .codegen.render import PDL_MIN_CC, pdl_available
from .codegen.spec import Spec
from .codegen.resolve import as_spec
from .codegen.transcode import transcode
from .fused_linear import fused_parts, install, sibling_groups
from .model_shapes import FUSE_GROUPS
from .runtime import arrays
from .runtime.device import current_arch
from .runtime.op import LAYOUTS, MatmulOp, QuantizeOp, quantize_spec
from .runtime.progress import Progress

__all__ = ["QuantLinear", "replace_linear", "ReplaceReport", "fuse_siblings", "stack_refusal", "n_axes", "quantized",
           "quantize_activation", "matmul", "quantize", "handle_for", "to_numpy", "to_array", "to_torch"]

_FLOAT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# storage dtype names (checkpoints.expected_tensors' first choice) -> torch dtype
_STORAGE = dict(_FLOAT, int32=torch.int32, uint8=torch.uint8, int8=torch.int8,
                float8_e4m3=torch.float8_e4m3fn)


# --- the op registry ---------------------------------------------------------------------

class _Entry:
    def __init__(self, spec: Spec, N: int, K: int, pdl: bool):
        self.spec, self.N, self.K, self.pdl = spec, N, K, pdl
        self._op = None

    def op(self):
        """The MatmulOp (or for an op-quantize spec, registered with N = 0,
        the QuantizeOp), built on first CUDA call (it needs a GPU to pick the
        arch). The layers hold the weight as the kernels read it (their
        kernel spec, this entry's spec): the op takes it as it is."""
        if self._op is None:
            self._op = (QuantizeOp(self.spec, self.K, pdl=self.pdl) if self.spec.op == "quantize"
                        else MatmulOp(self.spec, self.N, self.K, layout="stored", pdl=self.pdl))
        return self._op


_ENTRIES: List[_Entry] = []
_HANDLES: Dict[Tuple[str, int, int, bool], int] = {}


def handle_for(spec: Spec, N: int, K: int, pdl: bool = False) -> int:
    """The registry handle of (spec, N, K, pdl), registering it on first use
    (pdl: the op's kernels launched for programmatic dependent launch,
    runtime.op.MatmulOp's)."""
    key = (spec.content_hash(), int(N), int(K), bool(pdl))
    h = _HANDLES.get(key)
    if h is None:
        h = _HANDLES[key] = len(_ENTRIES)
        _ENTRIES.append(_Entry(spec, int(N), int(K), bool(pdl)))
    return h


# --- numpy <-> torch in opgen's storage conventions (bfloat16 as uint16 bits) ---------------

def to_numpy(t) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    if t.dtype == torch.uint32:      # int32 containers saved unsigned: same bits
        return t.view(torch.int32).numpy()
    return t.numpy()


def to_array(t):
    """A tensor as an array in opgen's storage conventions where it lies: a
    CPU tensor as numpy (`to_numpy`), a CUDA tensor as CuPy sharing its
    memory (DLPack; bfloat16 as uint16 bits, fp8 as uint8 bits)."""
    if not (isinstance(t, torch.Tensor) and t.is_cuda):
        return to_numpy(t)
    import cupy
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return cupy.from_dlpack(t.view(torch.uint8))
    if t.dtype == torch.uint32:
        return cupy.from_dlpack(t.view(torch.int32))
    return cupy.from_dlpack(t)


def to_torch(a, device=None) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        a = a.detach()               # storage, never part of an autograd graph
        if a.dtype == torch.uint32:  # the kernels' int32 containers: same bits
            a = a.view(torch.int32)
        return a if device is None else a.to(device)
    if type(a).__module__.split(".")[0] == "cupy":
        # on its GPU, through DLPack (CuPy's current stream hands it over)
        if a.dtype == np.uint16:
            t = torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_dlpack(a.view(np.int32) if a.dtype == np.uint32 else a)
        return t if device is None else t.to(device)
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:         # opgen's numpy form of bfloat16
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif a.dtype == np.uint32:
        t = torch.from_numpy(a.view(np.int32))
    else:
        t = torch.from_numpy(a)
    return t if device is None else t.to(device)


# --- the custom op -----------------------------------------------------------------------

@torch.library.custom_op("opgen::matmul", mutates_args=())
def matmul(a: torch.Tensor, qweight: torch.Tensor, scales: Optional[torch.Tensor],
           zeros: Optional[torch.Tensor], bias: Optional[torch.Tensor],
           a_scale: Optional[torch.Tensor], handle: int) -> torch.Tensor:
    """out[M, N] = a[M, K] @ W^T (+ bias, activation) for the (spec, N, K) of
    `handle`; arguments in the spec's storage, as MatmulOp takes them."""
    e = _ENTRIES[handle]
    if a.shape[0] == 0:
        return a.new_empty((0, e.N), dtype=_STORAGE[e.spec.out.dtype])
    if a.is_cuda:
        return e.op()(a, qweight, scales, zeros, bias=bias, a_scale=a_scale)
    tensors = {"qweight": to_numpy(qweight)}
    if scales is not None:
        tensors["scales"] = to_numpy(scales)
    if zeros is not None:
        tensors["zeros"] = to_numpy(zeros)
    out = R.reference_matmul(e.spec, to_numpy(a), tensors,
                             a_scale=None if a_scale is None else to_numpy(a_scale),
                             bias=None if bias is None else to_numpy(bias))
    return to_torch(out, a.device)


@matmul.register_fake
def _matmul_fake(a, qweight, scales, zeros, bias, a_scale, handle):
    e = _ENTRIES[handle]
    torch._check(a.shape[1] == e.K, lambda: f"a: expected [M, {e.K}], got {list(a.shape)}")
    return a.new_empty((a.shape[0], e.N), dtype=_STORAGE[e.spec.out.dtype])


# --- activation quantization -------------------------------------------------------------

@torch.library.custom_op("opgen::quantize", mutates_args=())
def quantize(x: torch.Tensor, handle: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K], a_scale [M] float32): the rows of x [M, K] quantized
    for the op-quantize spec of `handle` (handle_for(spec, 0, K)), bit for
    bit as quantize_activation does: on CUDA in one launch (QuantizeOp,
    where quantize_activation takes about ten torch kernels), elsewhere by it."""
    e = _ENTRIES[handle]
    if x.is_cuda and x.shape[0] > 0:
        return e.op()(x.contiguous())
    return quantize_activation(x, e.spec.out.dtype)


@quantize.register_fake
def _quantize_fake(x, handle):
    e = _ENTRIES[handle]
    torch._check(x.shape[1] == e.K, lambda: f"x: expected [M, {e.K}], got {list(x.shape)}")
    return (x.new_empty(x.shape, dtype=_STORAGE[e.spec.out.dtype]),
            x.new_empty(x.shape[:1], dtype=torch.float32))


def quantize_activation(x: torch.Tensor, target: str = "int8") -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric quantization of x [M, K], bit-for-bit
    codegen.reference.quantize_activation: a_scale = absmax / qmax (float32),
    codes = x / a_scale rounded half to even (int8: clipped to +-127; fp8
    e4m3: saturated to +-448), a zero row gets a_scale 1."""
    xf = x.float()
    qmax = {"int8": 127.0, "float8_e4m3": 448.0}[target]
    scale = xf.abs().amax(dim=-1) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    t = xf / scale[:, None]
    if target == "int8":
        return torch.round(t).clamp(-127, 127).to(torch.int8), scale
    return t.clamp(-qmax, qmax).to(torch.float8_e4m3fn), scale


# --- quantizing float weights --------------------------------------------------------------

def quantized(spec: Union[Spec, str], weight: torch.Tensor) -> Dict[str, torch.Tensor]:
    """A float weight [N, K] quantized into spec's storage (codegen.quantize_weight:
    round to nearest per group), on the device it lies on: a CUDA tensor by
    CuPy on torch's current stream, never through the host; any other by
    numpy. The same bytes either way. -> {"qweight", "scales", "zeros"} (those
    the spec stores) as torch tensors in opgen's storage dtypes."""
    spec = as_spec(spec)
    w = weight.detach().float()
    if not w.is_cuda:
        return {k: to_torch(v) for k, v in quantize_weight.quantize(spec, w.cpu().numpy()).items()}
    import cupy
    with cupy.cuda.Device(w.device.index), arrays.stream_for("torch", w):
        t = quantize_weight.quantize(spec, cupy.from_dlpack(w.contiguous()))
        return {k: to_torch(v) for k, v in t.items()}


# --- QuantLinear ------------------------------------------------------------------------

_BUFFERS = ("qweight", "scales", "zeros", "bias")


def _layout_arch() -> str:
    """The arch whose execution layout a layer takes: the current GPU's, or
    the planned one's without a GPU (every arch reads the same layout today:
    planner.execution.LAYOUTS; the op says so loudly if that ever differs)."""
    return current_arch() if torch.cuda.is_available() else "sm_90"


class QuantLinear(nn.Module):
    """A Linear whose weight is stored in `spec`'s quantized format.

    Given in the spec's storage (as the checkpoint holds it), the weight is
    moved once, here, into the layout the kernels read (`kernel_spec`,
    planner.execution_spec; layout="stored" keeps the spec's own). Buffers
    (so state_dict / load_state_dict / .to(device) work): qweight, scales,
    zeros (those the spec stores) and bias (or None), in kernel_spec's
    storage dtypes; `model.half()` and friends move them but never cast
    them. forward(x[..., K]) -> [..., N], in x's float dtype. pdl: its
    kernels launched for programmatic dependent launch (sm_90+; MatmulOp's;
    off by default until measured: docs/performance.md, "Programmatic
    dependent launch").
    """

    def __init__(self, spec: Union[Spec, str], in_features: int, out_features: int,
                 qweight, scales=None, zeros=None, bias=None, device=None, layout: str = "execution",
                 pdl: bool = False):
        super().__init__()
        spec = as_spec(spec)
        N, K = int(out_features), int(in_features)
        check_shape(spec, N, K)
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r}, expected one of {', '.join(LAYOUTS)}")
        if spec.a.dtype in ("int8", "float8_e4m3") and spec.a.scale != "row":
            raise ValueError(f"spec {spec.name}: {spec.a.dtype} activations without per-row "
                             f"scales cannot be produced from float inputs")
        if bias is not None and not spec.epilogue.bias and spec.epilogue.activation != "none":
            raise ValueError(f"bias: spec {spec.name} applies {spec.epilogue.activation} in its "
                             f"epilogue but has no bias, so the bias would be added after it")
        given = {"qweight": qweight, "scales": scales, "zeros": zeros}
        ck.validate_tensors(spec, {k: v for k, v in given.items() if v is not None}, N, K)
        if pdl and torch.cuda.is_available() and not pdl_available(current_arch()):
            raise ValueError(f"pdl: programmatic dependent launch needs sm_{PDL_MIN_CC} or newer, "
                             f"this GPU is {current_arch()}")
        self.spec, self.spec_name, self.pdl = spec, spec.name, bool(pdl)
        self.kernel_spec = execution_spec(spec, _layout_arch()) if layout == "execution" else spec
        self.in_features, self.out_features = K, N
        self._register_handles()
        if device is None and isinstance(qweight, torch.Tensor):
            device = qweight.device
        given = self._to_kernel_storage({k: to_torch(v) for k, v in given.items() if v is not None})
        for name in ("qweight", "scales", "zeros"):
            t = given.get(name)
            self.register_buffer(name, None if t is None else to_torch(t, device).contiguous())
        out_dt = _FLOAT[spec.out.dtype]
        if bias is None and spec.epilogue.bias:      # the kernel reads a bias: give it zeros
            bias = torch.zeros(N, dtype=out_dt)
        if bias is not None:
            bias = to_torch(bias, device)
            if tuple(bias.shape) != (N,):
                raise ValueError(f"bias: shape {list(bias.shape)}, expected [{N}]")
            bias = bias.to(out_dt).contiguous()
        self.register_buffer("bias", bias)

    def _to_kernel_storage(self, tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Tensors in spec's storage -> kernel_spec's (codegen.transcode, on
        the tensors' device; bit-exact)."""
        if self.kernel_spec is self.spec:
            return tensors
        return arrays.transcoded(
            lambda t: transcode(self.spec, self.kernel_spec, t, self.out_features, self.in_features),
            tensors)

    # --- constructors ---

    @classmethod
    def from_linear(cls, spec: Union[Spec, str], linear: nn.Linear, pdl: bool = False) -> "QuantLinear":
        """Quantize a float nn.Linear (weight [out=N, in=K]) where its weight
        lies: see `quantized`."""
        spec = as_spec(spec)
        t = quantized(spec, linear.weight)
        return cls(spec, linear.in_features, linear.out_features, bias=linear.bias,
                   device=linear.weight.device, pdl=pdl, **t)

    @classmethod
    def empty(cls, spec: Union[Spec, str], in_features: int, out_features: int,
              bias: bool = False, device=None, pdl: bool = False) -> "QuantLinear":
        """Zero-filled storage, to be filled by load_state_dict."""
        spec = as_spec(spec)
        want = ck.expected_tensors(spec, out_features, in_features)
        t = {k: torch.zeros(shape, dtype=_STORAGE[dts[0]], device=device)
             for k, (shape, dts) in want.items()}
        b = torch.zeros(out_features, dtype=_FLOAT[spec.out.dtype], device=device) if bias else None
        return cls(spec, in_features, out_features, bias=b, device=device, pdl=pdl, **t)

    @classmethod
    def from_checkpoint(cls, fmt: str, state: Mapping, in_features: int, out_features: int,
                        device=None, **kw) -> "QuantLinear":
        """One layer of a GPTQ ("gptq_v1"/"gptq_v2"), AWQ ("awq"), bitsandbytes
        NF4 ("bnb_nf4") or HF BitNet ("bitnet_hf") checkpoint, converted once by
        opgen.checkpoints (kw: group=, spec=). Tensors land on `device`
        (default: where the checkpoint's tensors are)."""
        if device is None:
            first = next((v for v in state.values() if isinstance(v, torch.Tensor)), None)
            device = None if first is None else first.device
        st = {k: to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        spec, t = ck.convert(fmt, st, out_features, in_features, **kw)
        return cls(spec, in_features, out_features, device=device, **t)

    @classmethod
    def stacked(cls, layers: Sequence["QuantLinear"]) -> "QuantLinear":
        """One layer computing what `layers` (one spec, layout, in_features
        and device) compute, side by side: each stored tensor joined along
        its n axis (n_axes), the biases too (zeros for those without).
        Exact: the same codes, scales and zero points. ValueError where they
        differ, or where a tensor has no n axis (a tensor scale)."""
        first = layers[0]
        ks, K = first.kernel_spec, first.in_features
        for q in layers[1:]:
            if (q.kernel_spec.content_hash(), q.in_features, q.pdl, q.qweight.device) != \
                    (ks.content_hash(), K, first.pdl, first.qweight.device):
                raise ValueError(f"stack: {q.spec_name} (K={q.in_features}) does not stack with "
                                 f"{first.spec_name} (K={K}): one spec, layout, K, pdl and device")
        axes = n_axes(ks)
        tensors = {}
        for name in ("qweight", "scales", "zeros"):
            if getattr(first, name) is not None:
                tensors[name] = torch.cat([getattr(q, name) for q in layers], dim=axes[name])
        bias = None
        if any(q.bias is not None for q in layers):
            bias = torch.cat([q.bias if q.bias is not None else first.qweight.new_zeros(
                q.out_features, dtype=_FLOAT[ks.out.dtype]) for q in layers])
        wide = cls(ks, K, sum(q.out_features for q in layers), bias=bias, device=first.qweight.device,
                   layout="stored", pdl=first.pdl, **tensors)
        wide.spec, wide.spec_name = first.spec, first.spec_name    # (the kernels read ks)
        wide._register_handles()
        return wide

    def dequantized(self) -> torch.Tensor:
        """The real weight W [N, K], float32, on the layer's device: the
        reference dequantization of the stored tensors (codegen.reference;
        CuPy on a GPU, on torch's current stream), what the kernels compute
        with."""
        tensors = {k: to_array(getattr(self, k)) for k in ("qweight", "scales", "zeros")
                   if getattr(self, k) is not None}
        if not self.qweight.is_cuda:
            return to_torch(R.dequantize(self.kernel_spec, tensors, self.out_features, self.in_features))
        import cupy
        with cupy.cuda.Device(self.qweight.device.index), arrays.stream_for("torch", self.qweight):
            w = R.dequantize(self.kernel_spec, tensors, self.out_features, self.in_features)
            return torch.from_dlpack(w)

    # --- forward ---

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features)
        a_scale = None
        if spec.a.dtype in _FLOAT:
            a = a.to(_FLOAT[spec.a.dtype]).contiguous()
        elif a.dtype in self.quantize_handles:
            a, a_scale = quantize(a, self.quantize_handles[a.dtype])
        else:                   # inputs the quantize kernel does not take
            a, a_scale = quantize_activation(a, spec.a.dtype)
        fused = self.bias if spec.epilogue.bias else None
        out = matmul(a, self.qweight, self.scales, self.zeros, fused, a_scale, self.handle)
        if self.bias is not None and not spec.epilogue.bias:
            out = out + self.bias
        out = out.reshape(*lead, self.out_features)
        return out.to(x.dtype) if x.is_floating_point() else out

    def _register_handles(self) -> None:
        """The registry handles of this layer's matmul and, for 8-bit
        activations, of the quantizers of fp16 and bf16 inputs into them
        where the quantize kernel takes rows of K (planner.check_shape)
        (looked up, not made, in forward: torch.compile traces it)."""
        self.handle = handle_for(self.kernel_spec, self.out_features, self.in_features, self.pdl)
        self.quantize_handles = {}
        if self.spec.a.dtype in _FLOAT:
            return
        for name, dt in _FLOAT.items():
            if dt == torch.float32:
                continue
            q = quantize_spec(self.spec, name)
            try:
                check_shape(q, K=self.in_features)
            except PlanError:
                continue
            self.quantize_handles[dt] = handle_for(q, 0, self.in_features, self.pdl)

    def extra_repr(self) -> str:
        layout = "" if self.kernel_spec is self.spec else f", layout={self.kernel_spec.name}"
        return (f"spec={self.spec_name}{layout}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}"
                + (", pdl=True" if self.pdl else ""))

    def __setstate__(self, state):
        # handles are per process: a pickled (torch.save(model)) layer
        # registers its (spec, N, K) again in the process that unpickles it
        # (a layer pickled before layers had pdl launches plainly)
        super().__setstate__(state)
        self.__dict__.setdefault("pdl", False)
        self._register_handles()

    # --- state dict ---

    def get_extra_state(self):
        return {"spec": self.spec_name, "spec_hash": self.spec.content_hash(),
                "layout": self.kernel_spec.name, "layout_hash": self.kernel_spec.content_hash(),
                "in_features": self.in_features, "out_features": self.out_features}

    def set_extra_state(self, state):
        mine = self.get_extra_state()
        for key in ("spec_hash", "in_features", "out_features"):
            if state.get(key) != mine[key]:
                raise ValueError(f"_extra_state: saved for spec {state.get('spec')} "
                                 f"{state.get('out_features')}x{state.get('in_features')}, this layer is "
                                 f"{self.spec_name} {self.out_features}x{self.in_features}")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Which storage the incoming tensors are in: the kernels' when the
        # extra state says so; the spec's own (a checkpoint's, or what an
        # opgen without execution layouts saved) when it names none.
        extra = state_dict.get(prefix + "_extra_state")
        if isinstance(extra, dict):
            self.set_extra_state(extra)          # the same weight format and shape, first
        saved = extra.get("layout_hash", self.spec.content_hash()) if isinstance(extra, dict) \
            else self.spec.content_hash()
        if saved != self.kernel_spec.content_hash():
            if saved != self.spec.content_hash():
                raise ValueError(f"{prefix}_extra_state: saved in layout {extra.get('layout')}, this "
                                 f"layer runs {self.kernel_spec.name}")
            given = {n: state_dict[prefix + n] for n in ("qweight", "scales", "zeros")
                     if state_dict.get(prefix + n) is not None}
            ck.validate_tensors(self.spec, given, self.out_features, self.in_features,
                                names={n: prefix + n for n in given})
            state_dict.update({prefix + n: t for n, t in self._to_kernel_storage(given).items()})
        # torch would silently cast a wrongly typed tensor into the buffer
        # (an int64 qweight, fp16 absmax): storage dtypes are part of the format
        for name in _BUFFERS:
            mine, theirs = getattr(self, name), state_dict.get(prefix + name)
            if mine is None or theirs is None:
                continue
            if tuple(theirs.shape) != tuple(mine.shape):
                raise ValueError(f"{prefix}{name}: shape {list(theirs.shape)}, expected "
                                 f"{list(mine.shape)} (spec {self.spec_name})")
            if theirs.dtype != mine.dtype:
                raise ValueError(f"{prefix}{name}: dtype {theirs.dtype}, expected {mine.dtype} "
                                 f"(spec {self.spec_name})")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) cast every float buffer; the storage dtypes are
        # the spec's, so follow only the device fn moves them to
        for name, buf in self._buffers.items():
            if buf is not None:
                moved = fn(buf)
                self._buffers[name] = moved if moved.dtype == buf.dtype else buf.to(moved.device)
        return self


# --- replace_linear ----------------------------------------------------------------------

@dataclass
class ReplaceReport:
    replaced: List[str] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)     # name -> why
    fused: List[Tuple[str, ...]] = field(default_factory=list)  # siblings run as one layer


def stacked_parts(layers: Sequence["QuantLinear"]) -> list:
    """The parts (opgen.fused_linear) of one layer stacking `layers`, in order."""
    return fused_parts(QuantLinear.stacked(layers), [q.out_features for q in layers])


def fuse_siblings(model: nn.Module, names: Optional[Iterable[str]] = None,
                  groups: Sequence[Sequence[str]] = FUSE_GROUPS) -> List[Tuple[str, ...]]:
    """Sibling QuantLinears of model that read the same input (`groups` of
    child names: q / k / v and gate / up by default; among `names`, default
    every QuantLinear) replaced in place by the parts of one stacked layer
    each (QuantLinear.stacked, opgen.fused_linear): one launch a group.
    Layers whose spec cannot stack (stack_refusal: a tensor scale) stay as
    they are. Groups are stacked and installed one at a time, so memory
    holds one group's weights twice at most (a failure leaves the groups
    before it stacked: the model computes the same either way).
    Returns the groups fused."""
    if names is None:
        names = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    names = [n for n in names if isinstance(model.get_submodule(n), QuantLinear)
             and stack_refusal(model.get_submodule(n).kernel_spec) is None]
    found = sibling_groups(model, names, groups)
    for group in found:
        install(model, dict(zip(group, stacked_parts([model.get_submodule(n) for n in group]))))
    return found


# replace_linear shows its progress once its layer loop has run this long
PROGRESS_AFTER_S = 1.0


def replace_linear(model: nn.Module, spec: Union[Spec, str], skip: Iterable[str] = (),
                   quantize: bool = True, progress: bool = True, pdl: bool = False,
                   fuse: Union[bool, Sequence[Sequence[str]], None] = None) -> ReplaceReport:
    """Swap every nn.Linear of `model` (in place) for a QuantLinear of `spec`.

    Layers whose shapes the spec's alignment rules refuse (N % 8, K % 32,
    K % group, ...) and layers matching a `skip` pattern (fnmatch on the
    qualified name, e.g. "lm_head" or "*.gate") stay float and are reported
    with the reason. Weights are quantized where they lie (`quantized`: a
    model on the GPU is quantized there); quantize=False allocates zero
    storage instead (for a load_state_dict that follows). A loop running over
    PROGRESS_AFTER_S seconds shows its progress on stderr (progress=False:
    never). pdl: QuantLinear's. fuse: siblings that read the same input
    (True: FUSE_GROUPS, q / k / v and gate / up; or groups of child names)
    then run as one stacked layer each (fuse_siblings; a spec whose every
    tensor has an n axis: n_axes), listed in the report's `fused`; None
    (the default): FUSE_GROUPS wherever the spec stacks (decode measured
    faster: docs/performance.md#whole-model-decode). With quantize=False the
    stacked storage takes the state dict of a model replaced the same way
    (fuse=False: of separate layers)."""
    spec = as_spec(spec)
    skip = list(skip)
    report = ReplaceReport()
    linears = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    if any(name == "" for name, _ in linears):
        raise ValueError("replace_linear swaps submodules; for a bare nn.Linear use "
                         "QuantLinear.from_linear")
    refusal = stack_refusal(execution_spec(spec, _layout_arch())) if fuse is not False else None
    if fuse is None:
        fuse = refusal is None
    elif fuse and refusal:
        raise ValueError(refusal)                           # (before any work)
    prog, start, shown, n = Progress(progress), time.monotonic(), False, len(linears)
    for i, (name, mod) in enumerate(linears):
        if time.monotonic() - start >= PROGRESS_AFTER_S:
            # on a pipe: the first line shown, then one per tenth of the layers
            milestone = not shown or 10 * i // n != 10 * (i - 1) // n
            prog.show(f"replace_linear {spec.name} {prog.bar(i, n)} {i}/{n} {name}", milestone=milestone)
            shown = True
        if any(fnmatch.fnmatchcase(name, p) for p in skip):
            report.skipped[name] = "matches skip="
            continue
        try:
            check_shape(spec, mod.out_features, mod.in_features)
        except ValueError as e:
            report.skipped[name] = str(e)
            continue
        if quantize:
            q = QuantLinear.from_linear(spec, mod, pdl=pdl)
        else:
            q = QuantLinear.empty(spec, mod.in_features, mod.out_features,
                                  bias=mod.bias is not None, device=mod.weight.device, pdl=pdl)
        install(model, {name: q})
        report.replaced.append(name)
    if fuse:
        report.fused = fuse_siblings(model, report.replaced, FUSE_GROUPS if fuse is True else fuse)
    if shown or time.monotonic() - start >= PROGRESS_AFTER_S:
        prog.show(f"replace_linear {spec.name} {prog.bar(n, n)} {n}/{n}: {len(report.replaced)} "
                  f"replaced, {len(report.skipped)} left float, {time.monotonic() - start:.1f} s",
                  milestone=True)
        prog.end()
    return report
