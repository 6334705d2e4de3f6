"""The variants of `opgen bench --e2e` (opgen/bench/e2e_variants.py): each
layer against the real weight it reports (the reference model is built from
those), the peers' round-to-nearest quantizer, the activations as each
variant's kernels take them, and the reference layer."""
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")     # (opgen.hf_checkpoint: the 'hf' extra)
from torch import nn  # noqa: E402

from opgen.bench import e2e_variants as ev  # noqa: E402
from opgen.bench.e2e import check_layer  # noqa: E402
from opgen.bench.e2e_report import shipped  # noqa: E402
from opgen.hf_checkpoint import load_quantized  # noqa: E402
from opgen.codegen import reference as R  # noqa: E402
from opgen.codegen.resolve import as_spec  # noqa: E402
from opgen.torch import quantize_activation, quantized, replace_linear, to_numpy  # noqa: E402

W4A16_PLAIN = "opgen:w4a16_sym_g128"    # (the default variants' one with separate siblings)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")


def linear(N=64, K=256, device="cpu", seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(K, N, bias=False).to(device).half()
    return lin


def test_the_targets_read_the_loaders_default():
    """The e2e targets read each spec's variant as opgen's loaders run it
    by default: siblings stacked (load_quantized's fuse, replace_linear's
    wherever the spec stacks)."""
    assert inspect.signature(load_quantized).parameters["fuse"].default is None     # (where it can)
    assert inspect.signature(replace_linear).parameters["fuse"].default is None
    assert ev.variant(shipped("w4a16_sym_g128")).fuse
    assert all(ev.variant(v).fuse for v in ev.DEFAULT_VARIANTS if v.startswith("opgen:") and v != W4A16_PLAIN)


def test_variant_names():
    assert isinstance(ev.variant("fp16"), ev.Fp16)
    v = ev.variant("opgen:w8a8_int8")
    assert v.name == "opgen:w8a8_int8" and v.spec.name == "w8a8_int8" and v.act == "int8"
    assert ev.variant("opgen:bnb_nf4").act is None
    assert ev.variant("torch_int4").act == "bfloat16"
    v = ev.variant("opgen:w4a16_sym_g128+pdl")
    assert v.name == "opgen:w4a16_sym_g128+pdl" and v.spec.name == "w4a16_sym_g128" and v.pdl and not v.fuse
    assert not ev.variant("opgen:w4a16_sym_g128").pdl
    assert ev.variant("opgen:w4a16_sym_g128+pdl").unavailable(torch.device("cpu")).startswith(
        "programmatic dependent launch needs a GPU")
    v = ev.variant("opgen:bnb_nf4+fuse+pdl")
    assert v.fuse and v.pdl and v.name == "opgen:bnb_nf4+fuse+pdl" and ev.variant("opgen:bnb_nf4+fuse").fuse
    for bad in ("opgen:", "opgen:+pdl", "opgen:bnb_nf4+fast", "opgen:bnb_nf4+pdl+pdl", "int4", "gemlite"):
        with pytest.raises(ValueError, match="unknown variant"):
            ev.variant(bad)
    assert set(ev.PEERS) <= set(ev.DEFAULT_VARIANTS)


def test_fp16_keeps_the_linear():
    lin = linear()
    assert ev.Fp16().layer(lin) == (lin, None)


def test_no_linear_gives_the_output_shape_and_no_weight():
    lin = linear(N=48, K=256)
    mod, real = ev.variant("no_linear").layer(lin)
    out = mod(torch.randn(2, 3, 256).half())
    assert real is None and out.shape == (2, 3, 48) and out.dtype == torch.float16


@pytest.mark.parametrize("spec", ["w4a16_sym_g128", "awq_w4a16_g128", "bnb_nf4", "w8a8_int8"])
def test_opgen_layer_and_its_real_weight(spec):
    """The real weight is the reference dequantization of what the layer
    stores, and the layer computes with it."""
    lin = linear()
    v = ev.variant(f"opgen:{spec}")
    q, real = v.layer(lin)
    tensors = {k: to_numpy(getattr(q, k)) for k in ("qweight", "scales", "zeros")
               if getattr(q, k) is not None}
    want = R.dequantize(q.kernel_spec, tensors, 64, 256)
    assert real.dtype == torch.float32 and np.array_equal(real.numpy(), want)
    assert check_layer(torch, v, q, real, lin) is None


def test_check_layer_refuses_a_wrong_layer():
    lin = linear()
    v = ev.variant("opgen:w4a16_sym_g128")
    q, real = v.layer(lin)

    class Off(nn.Module):
        def forward(self, x):
            return q(x) * 1.01
    assert "layer check" in check_layer(torch, v, Off(), real, lin)


def test_peer_codes_are_opgens_quantizer():
    """The peers take opgen's own codes in PEER_SPEC's form: 4-bit codes,
    group-128 scales and integer zero points whose (q - z) * s is the
    reference dequantization of what opgen's quantizer stores."""
    w = torch.randn(32, 512, generator=torch.Generator().manual_seed(3))
    q, s, z = ev.peer_codes(w)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and q.shape == (32, 512)
    assert s.shape == z.shape == (32, 4) and torch.equal(z, z.round()) and int(z.max()) <= 15
    real = (q.float() - z.repeat_interleave(128, 1)) * s.repeat_interleave(128, 1)
    t = {k: to_numpy(v) for k, v in quantized(ev.PEER_SPEC, w).items()}
    assert np.array_equal(real.numpy(), R.dequantize(as_spec(ev.PEER_SPEC), t, 32, 512))


def test_fake_quant_is_what_the_kernels_take():
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).half()
    assert torch.equal(ev.fake_quant(x, None), x.float())
    assert torch.equal(ev.fake_quant(x, "bfloat16"), x.to(torch.bfloat16).float())
    q, s = quantize_activation(x, "int8")
    assert torch.equal(ev.fake_quant(x, "int8"), q.float() * s[:, None])


def test_reference_layer_multiplies_in_its_dtype_and_keeps_its_weight_out_of_casts():
    w16 = torch.randn(8, 32).half()
    Ref = ev.reference_class()
    r32 = Ref(w16, None, torch.float32)
    x = torch.randn(3, 32)
    assert torch.allclose(r32(x), x @ w16.float().T)
    wrapper = nn.Sequential(r32).float()
    assert wrapper[0].w16.dtype == torch.float16 and not list(wrapper.parameters())
    out16 = Ref(w16, None, torch.float16)(x.half())
    assert out16.dtype == torch.float16


def test_the_peers_need_cuda():
    cpu = torch.device("cpu")
    assert "CUDA" in ev.TorchInt4().unavailable(cpu)
    assert "CUDA" in ev.GemliteW4().unavailable(cpu)
    assert ev.variant("opgen:w4a16_sym_g128").unavailable(cpu) is None


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", ["torch_int4", "gemlite_w4", "opgen:w4a16_sym_g128", "opgen:w8a8_int8"])
def test_gpu_each_layer_computes_with_the_weight_it_reports(name):
    """tinygemm's packing and gemlite's HQQ form as this module builds them:
    the layer against x @ real^T (what the reference model is made of)."""
    v = ev.variant(name)
    why = v.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    lin = linear(N=256, K=1024, device="cuda")
    mod, real = v.layer(lin)
    assert real.is_cuda and real.shape == (256, 1024)
    assert check_layer(torch, v, mod, real, lin) is None


def test_no_linear_keeps_its_input_computed_under_compile():
    """Inductor drops work whose result nothing reads: the no_linear layer's
    op must read its input, so the norm before a linear layer stays in the
    compiled step (torch.empty in forward let it go, and the compiled step's
    no_linear timed the step without its norms)."""
    from torch._inductor.utils import run_and_get_code
    mod, _ = ev.variant("no_linear").layer(linear(N=48, K=256))
    torch._dynamo.reset()
    fn = torch.compile(lambda x: mod(torch.sin(x) * 3.0), fullgraph=True)
    out, code = run_and_get_code(fn, torch.randn(2, 256))
    assert out.shape == (2, 48)
    assert any("sin" in c for c in code), "the op's input was not computed"


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(256, 128, bias=False).half(), nn.Linear(256, 32, bias=False).half()
        self.v_proj, self.o_proj = nn.Linear(256, 32, bias=False).half(), nn.Linear(128, 256, bias=False).half()


def test_fuse_variant_layers():
    """opgen:SPEC+fuse: q / k / v as parts of one wide layer, each part's
    real weight its rows of the wide one's (bit for bit what the layer
    quantized alone dequantizes to); o_proj as plain opgen:SPEC makes it."""
    torch.manual_seed(0)
    model = nn.Module()
    model.attn = Attention()
    names = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"]
    mods, reals = ev.variant("opgen:w4a16_sym_g128+fuse").layers(model, names)
    plain_mods, plain_reals = ev.variant("opgen:w4a16_sym_g128").layers(model, names)
    assert set(mods) == set(reals) == set(names)
    assert type(mods["attn.k_proj"]).__name__ == "FusedPart" and type(mods["attn.o_proj"]).__name__ == "QuantLinear"
    for n in names:
        assert torch.equal(reals[n], plain_reals[n]), n
    wide = mods["attn.q_proj"].wide.dequantized().to(reals["attn.q_proj"].dtype)
    for n in names[:3]:                          # each part's rows of the stacked layer
        lo, hi = mods[n].shared.bounds[mods[n].index]
        assert torch.equal(wide[lo:hi], reals[n]), n
    x = torch.randn(3, 256).half()
    with torch.no_grad():
        for n in names[:3]:
            assert torch.equal(mods[n](x), plain_mods[n](x)), n
