"""The variants `opgen bench --e2e` decodes with: how each turns one of the
model's fp16 nn.Linear layers into its own layer, and the real weight that
layer multiplies by (its dequantized weight: the model holding it in fp16 is
the reference of the variant's kernel error).

    fp16          the model as built: the baseline
    no_linear     every decoder linear layer replaced by one that computes
                  nothing (an uninitialized output, from an op opaque to
                  torch.compile): the step's time outside them, the bound of
                  what any kernel for them can gain
    opgen:SPEC    opgen.torch.QuantLinear of SPEC (a shipped name or a YAML
                  file), quantized where the weight lies (round to nearest)
    opgen:SPEC+pdl  the same, its kernels launched for programmatic
                  dependent launch (sm_90+: QuantLinear's pdl)
    opgen:SPEC+fuse  the same, q / k / v and gate / up each run as one
                  stacked layer (opgen.torch.fuse_siblings' way); options
                  combine: opgen:SPEC+fuse+pdl
    torch_int4    torch._weight_int4pack_mm (tinygemm): 4-bit asymmetric,
                  group 128; bfloat16 activations, as tinygemm takes them
    gemlite_w4    gemlite's A16W4 (HQQ form (q - z) * s): 4-bit asymmetric,
                  group 128; a Triton peer, used when the package is installed

The two peers take the codes of opgen's own round-to-nearest quantizer in
PEER_SPEC's form (`peer_codes`), so each variant's dequantized weight is
known exactly."""
from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..codegen import reference as R
from ..codegen import render
from ..codegen.resolve import as_spec
from ..codegen.spec import A8_DTYPES
from ..codegen.storage import decode_storage
from ..codegen.tolerance import tolerance
from ..runtime.device import current_arch
from . import gemlite_peer

# The peers' codes: opgen's quantizer into this shipped 4-bit asymmetric
# group-128 spec (so they take the codes opgen's AWQ variant runs).
PEER_SPEC = "awq_w4a16_g128"
DEFAULT_VARIANTS = ("fp16", "no_linear", "opgen:w4a16_sym_g128", "opgen:w4a16_sym_g128+fuse",
                    "opgen:awq_w4a16_g128+fuse", "opgen:bnb_nf4+fuse", "opgen:mxfp4+fuse",
                    "opgen:w8a8_int8+fuse", "torch_int4", "gemlite_w4")
PEERS = ("torch_int4", "gemlite_w4")
# opgen:SPEC+OPTION...: fuse (sibling layers as one), pdl (programmatic
# dependent launch); a variant's name lists its options in this order
OPGEN_OPTIONS = ("fuse", "pdl")


class Variant:
    """One way of running the model's linear layers. act: the activations its
    kernels multiply, when not the model's fp16 ones: "bfloat16" (rounded to
    it), "int8" / "float8_e4m3" (quantized per row, as opgen.torch does)."""
    name = ""
    act: Optional[str] = None
    # The layer check's bound (relative Frobenius error against its real
    # weight): the peers' own arithmetic (tinygemm in bfloat16, gemlite's fp16
    # decode) is theirs; a packing mistake is O(1).
    check_tol = 1e-2

    def unavailable(self, device) -> Optional[str]:
        """Why this variant cannot run on `device` (a torch.device), or None."""
        return None

    def layer(self, linear) -> Tuple[object, object]:
        """(the layer replacing `linear`, its real weight [N, K] float32 on
        linear's device); fp16 keeps the linear: (linear, None)."""
        return linear, None

    def layers(self, model, names: Sequence[str]) -> Tuple[Dict[str, object], Dict[str, object]]:
        """The layers replacing model's linears `names` (those that are not
        the linear itself) and their real weights (where there are) in fp16,
        as the reference model holds them (a whole model's float32 copies
        would not fit beside it): `layer` of each."""
        mods, reals = {}, {}
        for n in names:
            lin = model.get_submodule(n)
            mod, real = self.layer(lin)
            if mod is not lin:
                mods[n] = mod
            if real is not None:
                reals[n] = real.half()
        return mods, reals


class Fp16(Variant):
    name = "fp16"


class NoLinear(Variant):
    """Linear layers that launch nothing (an empty output of the right
    shape): the decode step less its linear layers, to time; its tokens mean
    nothing."""
    name = "no_linear"

    def layer(self, linear):
        return _no_linear_class()(linear.out_features), None


@functools.lru_cache(maxsize=None)
def _no_linear_class():
    import torch

    # A custom op, not torch.empty in forward: Inductor sees an output that
    # does not depend on the input and drops what computes the input (the
    # norms before q/k/v and the MLP), which the real layers need: under
    # torch.compile, no_linear timed 0.37 ms against fp16's 5.5 ms step (eager:
    # 2.9 of 7.4). An opaque op keeps its input live, as eager does.
    def empty(x, n):
        return x.new_empty((*x.shape[:-1], n))

    # (the schema spelled out: this module's annotations are strings; the
    # fake implementation is the op itself, which reads nothing)
    nothing = torch.library.custom_op("opgen_bench::no_linear", empty, mutates_args=(),
                                      schema="(Tensor x, int n) -> Tensor")
    nothing.register_fake(empty)

    class Nothing(torch.nn.Module):
        def __init__(self, N: int):
            super().__init__()
            self.N = N

        def forward(self, x):
            return nothing(x, self.N)
    return Nothing


class Opgen(Variant):
    def __init__(self, spec: str, pdl: bool = False, fuse: bool = False):
        self.spec, self.pdl, self.fuse = as_spec(spec), pdl, fuse
        on = {"fuse": fuse, "pdl": pdl}
        self.name = f"opgen:{spec}" + "".join(f"+{o}" for o in OPGEN_OPTIONS if on[o])
        self.act = self.spec.a.dtype if self.spec.a.dtype in A8_DTYPES else None
        self.check_tol = tolerance(self.spec)      # the kernel tests' bound

    def layer(self, linear):
        from ..torch import QuantLinear
        q = QuantLinear.from_linear(self.spec, linear, pdl=self.pdl)
        return q, q.dequantized()

    def layers(self, model, names):
        """With fuse, the sibling groups among names (fused_linear's) as the
        parts of one stacked layer each (exact: each part's real weight is
        its own layer's)."""
        mods, reals = super().layers(model, names)
        if not self.fuse:
            return mods, reals
        from ..fused_linear import sibling_groups
        from ..torch import stacked_parts
        for g in sibling_groups(model, names):
            mods.update(zip(g, stacked_parts([mods[n] for n in g])))
        return mods, reals

    def unavailable(self, device):
        if self.pdl and (device.type != "cuda" or not render.pdl_available(current_arch())):
            return f"programmatic dependent launch needs a GPU of sm_{render.PDL_MIN_CC} or newer"
        return None


def peer_codes(weight):
    """weight [N, K] quantized by opgen's own round-to-nearest quantizer into
    PEER_SPEC (4-bit asymmetric, group 128; the codes opgen's AWQ variant
    runs), where it lies: codes q (uint8 [N, K]), scales s and integer zero
    points z (float32 [N, K / 128]), weight ~ (q - z) * s."""
    from ..torch import quantized, to_array, to_torch
    spec = as_spec(PEER_SPEC)
    N, K = weight.shape
    t = {k: to_array(v) for k, v in quantized(spec, weight).items()}
    q = decode_storage(spec, t["qweight"]).astype(np.uint8)
    s, z = R.scale_logical(spec.b, t, N, K), R.zero_logical(spec.b, t, N, K)
    dev = weight.device
    return to_torch(q, dev), to_torch(s, dev).contiguous(), to_torch(z, dev).contiguous()


def _per_element(x, K: int):
    return x.repeat_interleave(K // x.shape[1], dim=1)


class TorchInt4(Variant):
    """tinygemm: W = (q - 8) * s + z, with s and z in bfloat16 ([K / 128, N, 2])."""
    name = "torch_int4"
    act = "bfloat16"

    def unavailable(self, device):
        import torch
        if device.type != "cuda":
            return "torch._weight_int4pack_mm runs on CUDA only"
        if not hasattr(torch, "_weight_int4pack_mm"):
            return f"torch {torch.__version__} has no _weight_int4pack_mm"
        return None

    def layer(self, linear):
        import torch
        q, s, z = peer_codes(linear.weight)
        s16 = s.to(torch.bfloat16)
        z16 = ((8 - z) * s).to(torch.bfloat16)          # (q - z) s = (q - 8) s + (8 - z) s
        packed = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()     # two codes a byte, even k high
        mod = _tinygemm_class()(torch._convert_weight_to_int4pack(packed, 8),
                                torch.stack([s16, z16], -1).transpose(0, 1).contiguous(),
                                linear.out_features, linear.in_features)
        K = linear.in_features
        real = (q.float() - 8) * _per_element(s16.float(), K) + _per_element(z16.float(), K)
        return mod, real


class GemliteW4(Variant):
    """gemlite A16W4, HQQ form: W = (q - z) * s with s and z in float16 (its
    kernels compute q * s + (-z * s), the product rounded to float16)."""
    name = "gemlite_w4"

    def unavailable(self, device):
        if device.type != "cuda":
            return "gemlite runs on CUDA only"
        try:
            gemlite_peer.gemlite()
        except RuntimeError as e:
            return str(e)
        return None

    def layer(self, linear):
        import torch
        q, s, z = peer_codes(linear.weight)
        s16 = s.to(torch.float16)
        z16 = z.to(torch.float16)                        # integers 0..15: exact
        mod = gemlite_peer.w4_layer(q, s16, z16)
        K = linear.in_features
        shift = (-z16.float() * s16.float()).to(torch.float16).float()
        real = q.float() * _per_element(s16.float(), K) + _per_element(shift, K)
        return mod, real


@functools.lru_cache(maxsize=None)
def _tinygemm_class():
    """The tinygemm layer (an nn.Module class made on first use: this module
    imports without torch)."""
    import torch
    from torch import nn

    class Tinygemm(nn.Module):
        def __init__(self, packed, scales_and_zeros, N: int, K: int):
            super().__init__()
            self.register_buffer("packed", packed)
            self.register_buffer("scales_and_zeros", scales_and_zeros)     # [K / group, N, 2]
            self.N, self.K, self.group = N, K, K // scales_and_zeros.shape[0]

        def forward(self, x):
            a = x.reshape(-1, self.K).to(torch.bfloat16)
            out = torch._weight_int4pack_mm(a, self.packed, self.group, self.scales_and_zeros)
            return out.to(x.dtype).reshape(*x.shape[:-1], self.N)
    return Tinygemm


def fake_quant(x, act: Optional[str]):
    """x [..., K] as a variant's kernels take it (act: Variant.act), float32."""
    import torch
    if act is None:
        return x.float()
    if act == "bfloat16":
        return x.to(torch.bfloat16).float()
    from ..torch import quantize_activation
    q, scale = quantize_activation(x.reshape(-1, x.shape[-1]), act)
    return (q.float() * scale[:, None]).reshape(x.shape)


@functools.lru_cache(maxsize=None)
def reference_class():
    """Reference(weight16, act, dtype): x @ W^T as a variant means it, its
    activations as its kernels take them (fake_quant), its real weight held
    in float16 (a plain attribute: model.float() leaves it alone), both cast
    to dtype to multiply: float16 for the reference model, float32 for that
    model's own fp32 counterpart."""
    import torch

    class Reference(torch.nn.Module):
        def __init__(self, weight16, act: Optional[str], dtype):
            super().__init__()
            self.w16, self.act, self.dtype = weight16, act, dtype

        def forward(self, x):
            a = fake_quant(x, self.act).to(self.dtype)
            return torch.nn.functional.linear(a, self.w16.to(self.dtype)).to(x.dtype)
    return Reference


def variant(name: str) -> Variant:
    """The variant of a name (`fp16`, `opgen:SPEC[+OPTION...]`, `torch_int4`,
    `gemlite_w4`); ValueError names the ones there are."""
    if name == "fp16":
        return Fp16()
    if name == "no_linear":
        return NoLinear()
    if name.startswith("opgen:"):
        spec, *options = name[len("opgen:"):].split("+")
        bad = [o for o in options if o not in OPGEN_OPTIONS]
        if spec and not bad and len(set(options)) == len(options):
            return Opgen(spec, pdl="pdl" in options, fuse="fuse" in options)
    if name == "torch_int4":
        return TorchInt4()
    if name == "gemlite_w4":
        return GemliteW4()
    raise ValueError(f"unknown variant {name!r} (known: fp16, no_linear, opgen:SPEC with options "
                     f"{', '.join('+' + o for o in OPGEN_OPTIONS)}, {', '.join(PEERS)})")
