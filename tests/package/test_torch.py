"""opgen.torch: QuantLinear, replace_linear, the opgen::matmul custom op.

CPU tests run the op's numpy-reference implementation; tests marked gpu run
the generated kernels (they also need a CUDA build of torch).
"""
import copy
import io
import time
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opgen.torch as ot  # noqa: E402
from opgen.fused_linear import FusedPart  # noqa: E402
from opgen import checkpoints as ck  # noqa: E402
from opgen.codegen.resolve import as_spec  # noqa: E402
from opgen.codegen import reference as R  # noqa: E402
from opgen.codegen import render  # noqa: E402
from opgen.codegen.quantize_weight import quantize  # noqa: E402
from opgen.codegen.tolerance import tolerance  # noqa: E402
from opgen.runtime.device import current_arch  # noqa: E402

WEIGHT_ONLY = ["gptq_v1_w4a16_g128", "gptq_v2_w4a16_g128", "awq_w4a16_g128", "bnb_nf4", "bitnet_b158"]
# int8 activations: W8A8 and sub-byte weights widened to int8 (issue 29)
A8_SPECS = ["w8a8_int8", "w4a8_int8", "w4a8_int8_g128", "bitnet_b158_a8"]
ALL_SPECS = WEIGHT_ONLY + A8_SPECS

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")


def tiny_mlp(seed: int = 0) -> nn.Sequential:
    """Two layers every shipped spec accepts, and a head of N=10 (N % 8) none does."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 256, bias=False),
                         nn.ReLU(), nn.Linear(256, 10))


def dequantized_model(qmodel: nn.Module, dtype=torch.float32) -> nn.Module:
    """The same model with each QuantLinear replaced by a float Linear holding
    its dequantized weight (the reference's dequantize)."""
    model = copy.deepcopy(qmodel)
    for name, mod in list(model.named_modules()):
        if isinstance(mod, ot.QuantLinear):
            t = {k: ot.to_numpy(getattr(mod, k)) for k in ("qweight", "scales", "zeros")
                 if getattr(mod, k) is not None}
            w = R.dequantize(mod.kernel_spec, t, mod.out_features, mod.in_features)
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w))
                if mod.bias is not None:
                    lin.bias.copy_(mod.bias.float())
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    lin.to(device=mod.qweight.device, dtype=dtype))
    return model


def rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


# --- CPU ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_replace_linear(spec):
    model = tiny_mlp()
    report = ot.replace_linear(model, spec)
    assert report.replaced == ["0", "2"]
    assert list(report.skipped) == ["4"] and "N=10 must be a multiple of 8" in report.skipped["4"]
    assert isinstance(model[4], nn.Linear)
    for i, bias in ((0, True), (2, False)):
        q = model[i]
        assert isinstance(q, ot.QuantLinear) and q.spec_name == spec
        want = ck.expected_tensors(q.kernel_spec, q.out_features, q.in_features)
        bufs = dict(q.named_buffers())
        assert set(bufs) == set(want) | ({"bias"} if bias else set())
        for k, (shape, dtypes) in want.items():
            assert tuple(bufs[k].shape) == shape and str(bufs[k].dtype)[6:] == dtypes[0]
        assert (q.bias is not None) == bias


class Block(nn.Module):
    """A decoder block's linears by their transformers names: q / k / v (k
    and v narrower, v with a bias) and gate / up read the same input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.q_proj, self.k_proj = nn.Linear(256, 128, bias=False), nn.Linear(256, 64, bias=False)
        self.v_proj, self.o_proj = nn.Linear(256, 64), nn.Linear(128, 256, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(256, 256, bias=False), nn.Linear(256, 256, bias=False)
        self.down_proj = nn.Linear(256, 256, bias=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = x + self.o_proj(q * torch.cat([k, v], -1))
        return h + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


@pytest.mark.parametrize("spec", ["w4a16_sym_g128", "gptq_v2_w4a16_g128", "awq_w4a16_g128", "bnb_nf4",
                                  "mxfp4", "w8a8_int8"])
def test_replace_linear_fuses_siblings(spec):
    """fuse=True: q / k / v and gate / up as one wide layer each, whose
    rows are bit for bit the layers each would be alone (the spec quantizes
    rows apart), so the model computes what the unfused one does."""
    plain, fused = Block(), Block()
    fused.load_state_dict(plain.state_dict())
    ot.replace_linear(plain, spec, fuse=False)
    report = ot.replace_linear(fused, spec, fuse=True)
    assert report.fused == [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
    assert sorted(report.replaced) == sorted(n for n, m in Block().named_modules() if isinstance(m, nn.Linear))
    wide = fused.q_proj.wide
    assert isinstance(wide, ot.QuantLinear) and wide.out_features == 256 and wide.bias is not None
    rows = torch.cat([plain.q_proj.dequantized(), plain.k_proj.dequantized(), plain.v_proj.dequantized()])
    assert torch.equal(wide.dequantized(), rows)
    assert torch.equal(wide.bias[192:].float(), plain.v_proj.bias.float()) and not wide.bias[:192].any()
    x = torch.randn(5, 256)
    with torch.no_grad():
        assert rel_err(fused(x), plain(x)) <= 1e-6


def test_replace_linear_fuses_by_default_where_it_can():
    """fuse=None (the default): the siblings stacked for a spec that stacks,
    none for a tensor-scale spec (no error); cross-attention (q and k / v
    read two inputs) never. A part answers for the wide layer's spec."""
    assert ot.replace_linear(Block(), "w4a16_sym_g128").fused == [("q_proj", "k_proj", "v_proj"),
                                                                   ("gate_proj", "up_proj")]
    b = Block()
    assert ot.replace_linear(b, "bitnet_b158").fused == [] and isinstance(b.q_proj, ot.QuantLinear)
    m = nn.ModuleDict(dict(self_attn=Block(), encoder_attn=Block(), cross_attention=Block()))
    assert sorted(ot.replace_linear(m, "w4a16_sym_g128").fused) == [
        ("self_attn.gate_proj", "self_attn.up_proj"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")]
    part = m["self_attn"].k_proj
    assert (part.spec_name, part.spec, part.kernel_spec, part.pdl) == (
        "w4a16_sym_g128", m["self_attn"].o_proj.spec, m["self_attn"].o_proj.kernel_spec, False)


def test_state_dict_of_fused_siblings_round_trips():
    """A fused model's state dict loads into storage replaced the same way
    (quantize=False fuses too); a separate-layer one with fuse=False."""
    model = Block()
    ot.replace_linear(model, "w4a16_sym_g128")
    fresh = Block()
    assert ot.replace_linear(fresh, "w4a16_sym_g128", quantize=False).fused == [
        ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(3, 256)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    plain, empty = Block(), Block()
    ot.replace_linear(plain, "w4a16_sym_g128", fuse=False)
    ot.replace_linear(empty, "w4a16_sym_g128", quantize=False, fuse=False)
    empty.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.equal(empty(x), plain(x))
    # separate layers' tensors into stacked storage: an error naming the cure, strict or not
    for strict in (True, False):
        with pytest.raises(RuntimeError, match="q_proj.qweight: a separate layer's tensor, but q_proj is part "
                                               "of a stacked layer .* fuse=False"):
            fresh.load_state_dict(plain.state_dict(), strict=strict)


def test_fuse_refuses_what_it_cannot_keep():
    """A tensor scale (one for the stacked weights), layers of two specs: a
    clear error each, before any work."""
    with pytest.raises(ValueError, match="bitnet_b158: its scales tensor is one for the whole weight"):
        ot.replace_linear(Block(), "bitnet_b158", fuse=True)
    b = Block()
    q = [ot.QuantLinear.from_linear("w4a16_sym_g128", b.q_proj), ot.QuantLinear.from_linear("bnb_nf4", b.k_proj)]
    with pytest.raises(ValueError, match="bnb_nf4 .K=256. does not stack with w4a16_sym_g128"):
        ot.QuantLinear.stacked(q)


def test_fuse_siblings_of_a_loaded_model():
    """fuse_siblings on layers already quantized (as a checkpoint loader
    makes them, GPTQ here: its execution layout, scales [K / g, N] joined
    along their second axis): the stacked layers hold exactly their rows,
    and siblings of two specs are not a group."""
    plain = Block()
    ot.replace_linear(plain, "gptq_v2_w4a16_g128", fuse=False)
    fused = copy.deepcopy(plain)
    assert ot.fuse_siblings(fused) == [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
    assert ot.n_axes(plain.q_proj.kernel_spec) == {"qweight": 0, "scales": 1, "zeros": 1}
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        wide = getattr(fused, group[0]).wide
        assert wide.spec_name == "gptq_v2_w4a16_g128" and wide.kernel_spec == plain.q_proj.kernel_spec
        assert torch.equal(wide.dequantized(), torch.cat([getattr(plain, n).dequantized() for n in group]))
    x = torch.randn(3, 256)
    with torch.no_grad():
        assert torch.equal(fused(x), plain(x))
    mixed = Block()
    ot.replace_linear(mixed, "w4a16_sym_g128", skip=["*v_proj"], fuse=False)
    mixed.v_proj = ot.QuantLinear.from_linear("bnb_nf4", Block().v_proj)
    assert ot.fuse_siblings(copy.deepcopy(mixed)) == [("gate_proj", "up_proj")]
    # nor siblings launched two ways
    mixed.up_proj = ot.QuantLinear.from_linear("w4a16_sym_g128", Block().up_proj, pdl=True)
    assert ot.fuse_siblings(mixed) == []
    # nor layers of a spec with a tensor scale (one for the stacked weights): they stay as they are
    ternary = Block()
    assert ot.replace_linear(ternary, "bitnet_b158").fused == []        # (the default: fuse where it can)
    assert ot.fuse_siblings(ternary) == [] and isinstance(ternary.q_proj, ot.QuantLinear)


def test_replace_linear_skip_patterns_and_root():
    model = tiny_mlp()
    report = ot.replace_linear(model, "gptq_v2_w4a16_g128", skip=["2"])
    assert report.replaced == ["0"] and report.skipped["2"] == "matches skip="
    with pytest.raises(ValueError, match="bare nn.Linear"):
        ot.replace_linear(nn.Linear(256, 128), "gptq_v2_w4a16_g128")


def test_replace_linear_shows_its_progress_when_slow(monkeypatch, capsys):
    """A layer loop running over PROGRESS_AFTER_S shows a bar on stderr (on a
    pipe: its first line, each tenth of the layers, the summary); a fast one,
    or progress=False, prints nothing."""
    ot.replace_linear(tiny_mlp(), "gptq_v2_w4a16_g128")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(ot, "PROGRESS_AFTER_S", 0.0)              # every loop is slow now
    ot.replace_linear(tiny_mlp(), "gptq_v2_w4a16_g128", progress=False)
    assert capsys.readouterr().err == ""
    ot.replace_linear(tiny_mlp(), "gptq_v2_w4a16_g128")
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == ["replace_linear gptq_v2_w4a16_g128 [--------------------] 0/3 0",
                         "replace_linear gptq_v2_w4a16_g128 [######--------------] 1/3 2",
                         "replace_linear gptq_v2_w4a16_g128 [#############-------] 2/3 4"]
    assert len(lines) == 4 and lines[3].startswith(
        "replace_linear gptq_v2_w4a16_g128 [####################] 3/3: 2 replaced, 1 left float, ")


@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "bnb_nf4", "mxfp4", "fp8_e4m3_w8a16"])
def test_quantized_on_the_cpu_is_the_reference(spec):
    """A CPU weight (any float dtype) is quantized by numpy: the reference's
    bytes, as torch tensors in opgen's storage dtypes."""
    lin = tiny_mlp()[0].to(torch.bfloat16)
    t = ot.quantized(spec, lin.weight)
    want = quantize(as_spec(spec), lin.weight.detach().float().numpy())
    assert set(t) == set(want)
    for k, v in want.items():
        assert isinstance(t[k], torch.Tensor) and np.array_equal(ot.to_numpy(t[k]).view(np.uint8),
                                                                 v.view(np.uint8)), k


@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "bnb_nf4", "w8a8_int8"])
def test_dequantized_is_the_reference_of_what_the_layer_holds(spec):
    """QuantLinear.dequantized: the reference dequantization of the layer's
    buffers (its kernel spec's storage), float32 [N, K]; to_array keeps
    opgen's storage conventions."""
    q = ot.QuantLinear.from_linear(spec, tiny_mlp()[0])
    tensors = {k: ot.to_numpy(getattr(q, k)) for k in ("qweight", "scales", "zeros")
               if getattr(q, k) is not None}
    w = q.dequantized()
    assert w.dtype == torch.float32 and tuple(w.shape) == (128, 256)
    assert np.array_equal(w.numpy(), R.dequantize(q.kernel_spec, tensors, 128, 256))
    for k, v in tensors.items():
        assert np.array_equal(ot.to_array(getattr(q, k)), v) and ot.to_array(getattr(q, k)).dtype == v.dtype


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_cpu_forward_matches_dequantized_model(spec):
    """forward flattens [..., K], quantizes activations where the spec needs
    it, adds the bias and restores the leading dims (CPU: numpy reference)."""
    model = tiny_mlp()
    ot.replace_linear(model, spec)
    x = torch.randn(2, 3, 256)
    with torch.no_grad():
        got = model(x)
        want = dequantized_model(model)(x)
    assert got.shape == (2, 3, 10) and got.dtype == torch.float32
    # fp16 activations and outputs between layers; A8_SPECS also int8 activations
    assert rel_err(got, want) <= (3e-2 if spec in A8_SPECS else 2e-3)


def test_pdl_layers_have_their_own_ops():
    """pdl=True (replace_linear's, QuantLinear's) registers the layer's
    (spec, N, K) apart from the plain launch; on the CPU both compute the
    reference."""
    plain, pdl = tiny_mlp(), tiny_mlp()
    pdl.load_state_dict(plain.state_dict())
    ot.replace_linear(plain, "w4a16_sym_g128")
    ot.replace_linear(pdl, "w4a16_sym_g128", pdl=True)
    assert not plain[0].pdl and pdl[0].pdl and "pdl=True" in repr(pdl[0])
    assert plain[0].handle != pdl[0].handle
    assert ot._ENTRIES[pdl[0].handle].pdl and not ot._ENTRIES[plain[0].handle].pdl
    x = torch.randn(3, 256)
    assert torch.equal(plain(x), pdl(x))


def test_layer_matches_reference_matmul():
    """One layer, exactly the reference: a = x in fp16, out fp16, + bias."""
    lin = tiny_mlp()[0]
    q = ot.QuantLinear.from_linear("awq_w4a16_g128", lin)
    x = torch.randn(5, 256).half()
    t = {k: ot.to_numpy(getattr(q, k)) for k in ("qweight", "scales", "zeros")}
    want = R.reference_matmul(q.kernel_spec, x.numpy(), t).astype(np.float32) + q.bias.float().numpy()
    got = q(x)
    assert got.dtype == torch.float16
    assert np.array_equal(got.numpy(), want.astype(np.float16))


@pytest.mark.parametrize("target", ["int8", "float8_e4m3"])
def test_quantize_activation_matches_reference(target):
    spec = as_spec("quantize_int8_row" if target == "int8" else "quantize_fp8_row")
    rng = np.random.default_rng(zlib.crc32(target.encode()))
    x = (rng.standard_normal((6, 64)) * 3).astype(np.float16)
    x[1] = 0                                            # zero row: scale 1
    x[2, :4] = [127, -63.5, 0.5, 1.5]                   # ties: half to even
    codes, scale = ot.quantize_activation(torch.from_numpy(x), target)
    want_codes, want_scale = R.quantize_activation(spec, x)
    assert np.array_equal(scale.numpy(), want_scale)
    got = codes.view(torch.uint8).numpy() if target != "int8" else codes.numpy()
    assert np.array_equal(got, want_codes)


def test_state_dict_round_trip():
    model = tiny_mlp()
    ot.replace_linear(model, "bnb_nf4")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert sd["0._extra_state"]["spec"] == "bnb_nf4"

    fresh = tiny_mlp(seed=1)
    report = ot.replace_linear(fresh, "bnb_nf4", quantize=False)      # empty storage
    assert report.replaced == ["0", "2"]
    fresh.load_state_dict(sd)
    for k, v in model.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(fresh.state_dict()[k], v), k
    x = torch.randn(4, 256)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))

    # whole-module pickling re-registers the op handle in the loading process
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded[0].handle == ot.handle_for(loaded[0].kernel_spec, 128, 256)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_load_state_dict_refuses_mismatches():
    model = tiny_mlp()
    ot.replace_linear(model, "gptq_v2_w4a16_g128")
    sd = model.state_dict()
    bad = dict(sd, **{"0.qweight": sd["0.qweight"].long()})
    with pytest.raises(ValueError, match=r"^0\.qweight: dtype torch\.int64, expected torch\.int32"):
        model.load_state_dict(bad)
    bad = dict(sd, **{"0.zeros": torch.zeros(2, 128, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"^0\.zeros: shape \[2, 128\], expected \[2, 16\]"):
        model.load_state_dict(bad)
    other = tiny_mlp()
    ot.replace_linear(other, "gptq_v1_w4a16_g128")        # same storage, other meaning
    with pytest.raises(ValueError, match="saved for spec gptq_v1_w4a16_g128"):
        model.load_state_dict(other.state_dict())


def test_weights_held_in_the_kernels_layout():
    """GPTQ as stored ([K/8, N]) is held as its kernels read it ([N, K/8],
    interleaved); layout="stored" keeps the checkpoint's. Both compute the
    same layer."""
    lin = tiny_mlp()[0]
    t = quantize(as_spec("gptq_v2_w4a16_g128"), lin.weight.detach().numpy())
    held = ot.QuantLinear("gptq_v2_w4a16_g128", 256, 128, **t)
    kept = ot.QuantLinear("gptq_v2_w4a16_g128", 256, 128, layout="stored", **t)
    assert held.kernel_spec.name == "gptq_v2_w4a16_g128_exec" and kept.kernel_spec is kept.spec
    assert tuple(held.qweight.shape) == (128, 32) and tuple(kept.qweight.shape) == (32, 128)
    assert "layout=gptq_v2_w4a16_g128_exec" in repr(held)
    x = torch.randn(4, 256).half()
    assert torch.equal(held(x), kept(x))


def test_load_state_dict_in_either_storage():
    """A state dict whose extra state names the kernels' layout loads as it
    is; one without (a checkpoint's tensors in the spec's own storage, or
    what an opgen before execution layouts saved) is moved there first."""
    lin = tiny_mlp()[0]
    t = quantize(as_spec("gptq_v2_w4a16_g128"), lin.weight.detach().numpy())
    src = ot.QuantLinear("gptq_v2_w4a16_g128", 256, 128, **t)
    dst = ot.QuantLinear.empty("gptq_v2_w4a16_g128", 256, 128)
    dst.load_state_dict(src.state_dict())
    assert torch.equal(dst.qweight, src.qweight)
    dst = ot.QuantLinear.empty("gptq_v2_w4a16_g128", 256, 128)
    stored = {k: torch.from_numpy(v) for k, v in t.items()}
    dst.load_state_dict(stored, strict=False)
    assert torch.equal(dst.qweight, src.qweight) and torch.equal(dst.zeros, src.zeros)
    old = dict(stored, _extra_state={k: v for k, v in src.get_extra_state().items()
                                     if k not in ("layout", "layout_hash")})
    dst = ot.QuantLinear.empty("gptq_v2_w4a16_g128", 256, 128)
    dst.load_state_dict(old, strict=False)
    assert torch.equal(dst.qweight, src.qweight)
    with pytest.raises(ValueError, match=r"^qweight: shape \[128, 32\], expected \[32, 128\]"):
        ot.QuantLinear.empty("gptq_v2_w4a16_g128", 256, 128).load_state_dict(
            dict(stored, qweight=src.qweight), strict=False)


def test_half_keeps_storage_dtypes():
    model = tiny_mlp()
    ot.replace_linear(model, "bnb_nf4")
    model.half()
    assert model[0].scales.dtype == torch.float32 and model[0].qweight.dtype == torch.uint8
    assert model[0].bias.dtype == torch.float16 and model[4].weight.dtype == torch.float16
    model.to(torch.bfloat16)
    assert model[0].scales.dtype == torch.float32


def test_from_checkpoint_torch_tensors():
    rng = np.random.default_rng(7)
    N, K = 64, 256
    q = rng.integers(0, 16, size=(K, N)).astype(np.uint32)
    qweight = np.zeros((K // 8, N), np.uint32)
    for j in range(8):
        qweight |= q[j::8] << (4 * j)
    state = {"qweight": torch.from_numpy(qweight.view(np.int32)),
             "qzeros": torch.full((2, 8), 0x77777777, dtype=torch.int32),     # v1 sym: z - 1 = 7
             "scales": torch.rand(2, N).half() / 64, "g_idx": torch.arange(K) // 128}
    layer = ot.QuantLinear.from_checkpoint("gptq_v1", state, in_features=K, out_features=N)
    assert layer.spec_name == "gptq_v1_w4a16_g128" and layer.bias is None
    assert layer.kernel_spec.name == "gptq_v1_w4a16_g128_exec"
    w = R.dequantize(layer.kernel_spec, {"qweight": layer.qweight.numpy(), "scales": layer.scales.numpy(),
                                  "zeros": layer.zeros.numpy()}, N, K)
    s = np.repeat(state["scales"].float().numpy(), 128, axis=0).T
    assert np.array_equal(w, (q.T.astype(np.float32) - 8) * s)
    with pytest.raises(ValueError, match=r"^qzeros: shape \[2, 64\]"):
        ot.QuantLinear.from_checkpoint("gptq_v1", dict(state, qzeros=torch.zeros(2, N, dtype=torch.int32)),
                                       in_features=K, out_features=N)
    with pytest.raises(ValueError, match="act-order"):
        ot.QuantLinear.from_checkpoint("gptq_v1", dict(state, g_idx=torch.randperm(K) // 128),
                                       in_features=K, out_features=N)


def test_quantlinear_refuses_bad_storage():
    t = quantize(as_spec("awq_w4a16_g128"), np.ones((64, 256), np.float32))
    with pytest.raises(ValueError, match=r"^scales: dtype float32, expected float16"):
        ot.QuantLinear("awq_w4a16_g128", 256, 64, t["qweight"], t["scales"].astype(np.float32), t["zeros"])
    with pytest.raises(ValueError, match="must be a multiple of the scale group 128"):
        ot.QuantLinear("awq_w4a16_g128", 192, 64, t["qweight"], t["scales"], t["zeros"])


def test_custom_op_registered_with_fake_impl():
    from torch._subclasses.fake_tensor import FakeTensorMode
    assert hasattr(torch.ops.opgen, "matmul")
    q = ot.QuantLinear.from_linear("gptq_v2_w4a16_g128", tiny_mlp()[0])
    with FakeTensorMode() as mode:
        a = torch.empty(7, 256, dtype=torch.float16)
        args = [mode.from_tensor(t) for t in (q.qweight, q.scales, q.zeros)]
        out = torch.ops.opgen.matmul(a, *args, None, None, q.handle)
        assert out.shape == (7, 128) and out.dtype == torch.float16


def test_opcheck():
    q = ot.QuantLinear.from_linear("w8a8_int8", tiny_mlp()[0])
    a, a_scale = ot.quantize_activation(torch.randn(3, 256))
    torch.library.opcheck(torch.ops.opgen.matmul.default,
                          (a, q.qweight, q.scales, None, None, a_scale, q.handle))


def test_torch_compile_traces_the_op():
    """aot_eager: Dynamo + AOTAutograd through the fake impl, no codegen
    (Inductor needs a C++ toolchain on CPU); dynamic M."""
    model = tiny_mlp()
    ot.replace_linear(model, "gptq_v2_w4a16_g128")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for M in (3, 5):
            x = torch.randn(M, 256)
            assert torch.equal(compiled(x), model(x))


def test_a8_layers_quantize_through_the_op():
    """Layers of 8-bit activations quantize fp16 inputs through
    opgen::quantize (one kernel on CUDA; here quantize_activation, bit for
    bit), which torch.compile keeps as one op (dynamic M)."""
    model = tiny_mlp()[:4]               # (the head stays a float Linear)
    ot.replace_linear(model, "w8a8_int8")
    x = torch.randn(5, 256).half()
    codes, scale = torch.ops.opgen.quantize(x, model[0].quantize_handles[torch.float16])
    want_codes, want_scale = ot.quantize_activation(x, "int8")
    assert torch.equal(codes, want_codes) and torch.equal(scale, want_scale)
    seen = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for M in (3, 5):
            x = torch.randn(M, 256).half()
            assert torch.equal(compiled(x), model(x))
    assert "opgen.quantize.default" in seen and "opgen.matmul.default" in seen


# --- GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ALL_SPECS + ["w4a8_fp8"])
def test_gpu_layer_matches_reference(spec, record):
    lin = tiny_mlp()[0]
    q = ot.QuantLinear.from_linear(spec, lin).cuda()
    x = torch.randn(3, 5, 256, device="cuda").half()
    got = q(x).float().cpu().reshape(15, 128)
    t = {k: ot.to_numpy(getattr(q, k)) for k in ("qweight", "scales", "zeros") if getattr(q, k) is not None}
    xs = x.reshape(15, 256).cpu()
    a, a_scale = (xs.numpy(), None)
    if q.spec.a.dtype in ("int8", "float8_e4m3"):
        a, a_scale = (ot.to_numpy(v) for v in ot.quantize_activation(xs, q.spec.a.dtype))
    want = R.reference_matmul_f32(q.kernel_spec, a, t, a_scale=a_scale) + q.bias.float().cpu().numpy()
    err = rel_err(got, torch.from_numpy(want))
    record(test="torch_layer", spec=spec, rel_err=err, tol=tolerance(q.kernel_spec))
    assert err <= tolerance(q.kernel_spec)     # w4a8_fp8's bf16 output alone rounds by ~2.3e-3


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["gptq_v1_w4a16_g128", "awq_w4a16_g128"])
def test_gpu_layer_moves_cuda_tensors_on_the_gpu(spec):
    """Given CUDA tensors, the move into the kernels' layout runs on the GPU
    (CuPy through DLPack) and gives the bytes the CPU's numpy move gives."""
    t = quantize(as_spec(spec), tiny_mlp()[0].weight.detach().numpy())
    cpu = ot.QuantLinear(spec, 256, 128, **t)
    gpu = ot.QuantLinear(spec, 256, 128, **{k: ot.to_torch(v).cuda() for k, v in t.items()})
    assert gpu.qweight.is_cuda and gpu.kernel_spec == cpu.kernel_spec
    for k in ("qweight", "scales", "zeros"):
        assert torch.equal(getattr(gpu, k).cpu(), getattr(cpu, k)), k


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", WEIGHT_ONLY)
def test_gpu_model_matches_dequantized_model(spec, record):
    model = tiny_mlp().cuda().half()
    ot.replace_linear(model, spec)
    ref = dequantized_model(model, dtype=torch.float16)
    x = torch.randn(4, 7, 256, device="cuda").half()
    with torch.no_grad():
        err = rel_err(model(x), ref(x))
    record(test="torch_model", spec=spec, rel_err=err)
    assert err <= 2e-3


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "w8a8_int8", "w4a8_int8_g128"])
def test_gpu_torch_compile(spec):
    model = tiny_mlp().cuda().half()
    ot.replace_linear(model, spec)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for M in (1, 16, 37):
            x = torch.randn(M, 256, device="cuda").half()
            eager, comp = model(x), compiled(x)
            # Inductor may fuse the activation quantization differently: one int8
            # step; fp16: both paths round the hidden layer and the output to
            # fp16 (2^-11 each) at different points, as the kernel tests allow.
            tol = 2e-2 if spec in A8_SPECS else 2e-3
            assert rel_err(comp, eager) <= tol


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "bnb_nf4", "w8a8_int8"])
def test_gpu_cuda_graph_replay_equals_eager(spec):
    model = tiny_mlp().cuda().half()
    ot.replace_linear(model, spec)
    check_graph_replay(model, 16)


def check_graph_replay(model: nn.Module, M: int, eager: nn.Module = None) -> None:
    """model(x[M, 256]) captured in a CUDA graph, replayed on fresh inputs:
    equal, bit for bit, to `eager` (default: model itself) run eagerly."""
    eager = eager or model
    static_x = torch.randn(M, 256, device="cuda").half()
    # Warm up on the stream that then captures: the first call of an M bucket
    # compiles and loads its kernel, and split-K kernels allocate their
    # workspace per stream; neither may happen during capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, stream=side):
        static_out = model(static_x)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        static_x.copy_(torch.randn(M, 256, device="cuda").half())
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.equal(static_out, eager(static_x)), (M, seed)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["w4a16_sym_g128", "bnb_nf4", "w8a8_int8"])
def test_gpu_fused_siblings_in_a_torch_graph(spec, record):
    """Fused siblings on the GPU: the block matches its dequantized-weights
    twin within the spec's tolerance (one wide kernel for q / k / v, one for
    gate / up), and a captured CUDA graph replays the eager outputs."""
    block = Block().cuda().half()
    ot.replace_linear(block, spec, fuse=True)
    ref = _float_twin(block)
    for M in (1, 16):
        x = torch.randn(M, 256, device="cuda").half()
        with torch.no_grad():
            err = rel_err(block(x), ref(x))
        record(test="torch_fused", spec=spec, M=M, rel_err=err)
        assert err <= (3e-2 if spec in A8_SPECS else 2e-3), (M, err)
        check_graph_replay(block, M)


def _float_twin(block: "Block") -> "Block":
    """A float16 Block holding block's dequantized weights (a fused part:
    its rows of the wide layer's) and biases."""
    twin = Block().to(block.o_proj.qweight.device).half()
    with torch.no_grad():
        for name, lin in twin.named_children():
            mod = getattr(block, name)
            if isinstance(mod, FusedPart):
                lo, hi = mod.shared.bounds[mod.index]
                wide = mod.shared.wide
                w, b = wide.dequantized()[lo:hi], None if wide.bias is None else wide.bias[lo:hi]
            else:
                w, b = mod.dequantized(), mod.bias
            lin.weight.copy_(w)
            if lin.bias is not None:
                lin.bias.copy_(b)
    return twin


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["w4a16_sym_g128", "w8a8_int8"])
def test_gpu_pdl_layers_in_a_torch_graph_equal_plain_ones(spec):
    """Layers launched for programmatic dependent launch, behind torch's own
    kernels (which give no early signal) and each other, captured in a torch
    CUDA graph: bit-equal to the plain layers run eagerly (the same configs,
    the same sums; only the launch differs). M = 1 and 16: the GEMVs and a
    GEMM."""
    if not render.pdl_available(current_arch()):
        pytest.skip(f"no programmatic dependent launch on {current_arch()}")
    plain, pdl = tiny_mlp().cuda().half(), tiny_mlp().cuda().half()
    pdl.load_state_dict(plain.state_dict())
    ot.replace_linear(plain, spec, fuse=False)
    ot.replace_linear(pdl, spec, pdl=True)
    for M in (1, 16):
        check_graph_replay(pdl, M, eager=plain)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "bnb_nf4", "mxfp4", "w8a8_int8"])
def test_gpu_dequantized_on_the_gpu_equals_the_cpus(spec):
    """On CUDA buffers the dequantization runs in CuPy on torch's stream: the
    CPU layer's values, bit for bit, and nothing through the host."""
    cpu = ot.QuantLinear.from_linear(spec, tiny_mlp()[0])
    gpu = ot.QuantLinear.from_linear(spec, tiny_mlp()[0].cuda())
    w = gpu.dequantized()
    assert w.is_cuda and torch.equal(w.cpu(), cpu.dequantized())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ALL_SPECS + ["mxfp4", "fp8_e4m3_w8a16", "w1a16_g128"])
def test_gpu_quantizes_on_the_gpu_with_the_references_bytes(spec, monkeypatch):
    """A Linear on the GPU is quantized there (CuPy, through DLPack: nothing
    goes through the host) into the bytes the CPU's numpy gives."""
    lin = tiny_mlp()[0].half()
    cpu = ot.QuantLinear.from_linear(spec, lin)
    lin = lin.cuda()

    def host(*a, **k):
        raise AssertionError("a host copy")
    monkeypatch.setattr(torch.Tensor, "cpu", host)
    monkeypatch.setattr(torch.Tensor, "numpy", host)
    gpu = ot.QuantLinear.from_linear(spec, lin)
    monkeypatch.undo()
    for k in ("qweight", "scales", "zeros", "bias"):
        g, c = getattr(gpu, k), getattr(cpu, k)
        assert (g is None) == (c is None), k
        if g is not None:
            assert g.is_cuda and g.dtype == c.dtype and torch.equal(g.cpu(), c), k


class _Llama3_8BLayer(nn.Module):
    """The seven linear layers of a Llama-3-8B decoder layer (fp16, no bias)."""

    def __init__(self):
        super().__init__()
        lin = lambda k, n: nn.Linear(k, n, bias=False, device="cuda", dtype=torch.float16)  # noqa: E731
        self.self_attn = nn.ModuleDict(dict(q_proj=lin(4096, 4096), k_proj=lin(4096, 1024),
                                            v_proj=lin(4096, 1024), o_proj=lin(4096, 4096)))
        self.mlp = nn.ModuleDict(dict(gate_proj=lin(4096, 14336), up_proj=lin(4096, 14336),
                                      down_proj=lin(14336, 4096)))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "bnb_nf4", "mxfp4", "w8a8_int8"])
def test_gpu_replace_linear_quantizes_a_llama3_8b_shaped_model_in_under_15_s(spec, record):
    """replace_linear on a 32-layer Llama-3-8B-shaped model on the H200:
    under 15 s (issue target; CuPy's kernels compiled first, on a small
    model; siblings stacked, as by default): a layer of each shape holds the
    bytes the CPU gives it, a stacked part the CPU layer's real weight."""
    ot.replace_linear(tiny_mlp().cuda().half(), spec, progress=False)        # compile CuPy's kernels
    torch.manual_seed(0)
    model = nn.ModuleList([_Llama3_8BLayer() for _ in range(32)])
    first = {n: copy.deepcopy(m).cpu() for n, m in model[0].named_modules() if isinstance(m, nn.Linear)}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    report = ot.replace_linear(model, spec)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    record(test="replace_linear_llama3_8b_gpu", spec=spec, seconds=seconds, layers=len(report.replaced))
    assert len(report.replaced) == 32 * 7 and not report.skipped
    assert len(report.fused) == 32 * 2
    for name, lin in first.items():
        want = ot.QuantLinear.from_linear(spec, lin)
        got = model[0].get_submodule(name)
        if not isinstance(got, ot.QuantLinear):       # a stacked part
            assert torch.equal(got.dequantized().cpu(), want.dequantized()), name
            continue
        for k in ("qweight", "scales", "zeros"):
            if getattr(want, k) is not None:
                assert torch.equal(getattr(got, k).cpu(), getattr(want, k)), (name, k)
    del model
    torch.cuda.empty_cache()
    assert seconds < 15.0
