"""opgen.hf_formats, unit by unit: the specs derived for a checkpoint
(groups, bfloat16, bitsandbytes' FP4 table, compressed-tensors' layouts,
checked against the libraries' own packers), act-order, compressed-tensors'
targets, and the quantization_config errors. Whole checkpoints:
test_hf_checkpoint.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from opgen import hf_formats as hf  # noqa: E402
from opgen.codegen import reference as R  # noqa: E402
from opgen.codegen.resolve import as_spec  # noqa: E402
from opgen.codegen.storage import encode_codes  # noqa: E402

SRC = "ck/config.json"


def test_variants_of_shipped_specs():
    shipped = as_spec("gptq_v2_w4a16_g128")
    assert hf._variant("gptq_v2_w4a16_g128", torch.float16, SRC, 128) == shipped
    g32 = hf._variant("gptq_v2_w4a16_g128", torch.float16, SRC, 32)
    assert g32.name == "gptq_v2_w4a16_g32" and g32.b.scale.group == 32
    assert g32.b.zero == shipped.b.zero and g32.b.pack == shipped.b.pack
    bf = hf._variant("bnb_nf4", torch.bfloat16, SRC, 128)
    assert bf.name == "bnb_nf4_g128_bf16" and bf.a.dtype == bf.out.dtype == "bfloat16"
    assert hf._variant("bnb_nf4", torch.bfloat16, SRC, 128) is bf          # made once
    with pytest.raises(hf.CheckpointError, match=f"{SRC}: quantization_config.group_size: "
                                                 "opgen's spec for it is not valid"):
        hf._variant("gptq_v2_w4a16_g128", torch.float16, SRC, 4)            # not a multiple of 8


def test_bnb_fp4_spec_is_bitsandbytes_table():
    F = pytest.importorskip("bitsandbytes.functional")
    spec = hf._bnb_fp4_spec(64, torch.float16)
    assert spec.b.dtype == "codebook" and spec.b.codebook == hf.BNB_FP4
    assert spec.b.pack == as_spec("bnb_nf4").b.pack and spec.b.scale == as_spec("bnb_nf4").b.scale
    np.testing.assert_array_equal(np.float32(hf.BNB_FP4), F.get_4bit_type("fp4", device="cpu").numpy())


@pytest.mark.parametrize("bits, symmetric, channel", [(4, True, False), (4, False, False),
                                                      (4, False, True), (8, True, True),
                                                      (8, False, False)])
def test_compressed_tensors_layout_is_the_librarys(bits, symmetric, channel):
    """Signed codes and zero points packed by compressed-tensors'
    pack_to_int32 read back through _ct_spec's storage as codes + 2^(bits-1)."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    N, K, G = 64, 128, 32
    rng = np.random.default_rng(bits * 10 + symmetric + 2 * channel)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1))
    codes = rng.integers(lo, hi, (N, K)).astype(np.int8)
    cols = 1 if channel else K // G
    zp = rng.integers(lo, hi, (N, cols)).astype(np.int8)
    st = {"weight_packed": pack_to_int32(torch.from_numpy(codes), bits).numpy(),
          "weight_scale": np.ones((N, cols), np.float16), "weight_shape": np.array([N, K])}
    if not symmetric:
        st["weight_zero_point"] = pack_to_int32(torch.from_numpy(zp), bits, packed_dim=0).numpy()
    w = {"num_bits": bits, "symmetric": symmetric, "strategy": "channel" if channel else "group",
         "group_size": G}
    spec = hf._ct_spec(w, "float16", torch.float16, SRC)
    t = hf._ct_tensors(spec, st, N, K)
    z = 0 if symmetric else np.repeat(zp.astype(np.float32), K // cols, axis=1)
    np.testing.assert_array_equal(R.dequantize(spec, t, N, K), codes.astype(np.float32) - z)
    bad = dict(st, weight_packed=st["weight_packed"][:, :-1])
    with pytest.raises(ValueError, match=r"weight_packed: shape \[64, \d+\], expected"):
        hf._ct_tensors(spec, bad, N, K)
    with pytest.raises(ValueError, match=r"weight_shape: \[64, 256\], expected \[64, 128\]"):
        hf._ct_tensors(spec, dict(st, weight_shape=np.array([N, 2 * K])), N, K)


def test_act_order_permutes_the_codes():
    """The stored codes move so that row j of K is original row perm[j]:
    the weight read with the permuted input is the same."""
    spec = as_spec("gptq_v2_w4a16_g128")
    N, K, G = 64, 256, 128
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (N, K))
    t = {"qweight": encode_codes(spec, codes), "scales": np.ones((K // G, N), np.float16),
         "zeros": np.zeros((K // G, N // 8), np.int32)}
    g_idx = np.empty(K, np.int64)
    g_idx[rng.permutation(K)] = np.arange(K) // G
    perm = hf._act_order(g_idx, spec, t, N, K)
    assert np.array_equal(g_idx[perm], np.arange(K) // G)
    np.testing.assert_array_equal(R.dequantize(spec, t, N, K), codes[:, perm].astype(np.float32))
    assert hf._act_order(np.arange(K) // G, spec, dict(t), N, K) is None          # trivial
    with pytest.raises(ValueError, match=r"g_idx: shape \[8\], expected \[256\]"):
        hf._act_order(np.zeros(8), spec, t, N, K)


def test_compressed_tensors_targets():
    lin = nn.Linear(2, 2)
    assert hf._ct_matches("model.layers.0.self_attn.q_proj", lin, "Linear")
    assert hf._ct_matches("model.layers.0.self_attn.q_proj", lin, "re:.*self_attn")
    assert not hf._ct_matches("model.layers.0.mlp.up_proj", lin, "re:.*self_attn")
    assert hf._ct_matches("lm_head", lin, "lm_head") and not hf._ct_matches("lm_head", lin, "Embedding")


@pytest.mark.parametrize("method, q, msg", [
    ("gptq", {"bits": 8}, "quantization_config.bits: 8; opgen loads 4"),
    ("gptq", {"group_size": "128"}, "quantization_config.group_size: '128' is not a positive"),
    ("awq", {"zero_point": False}, "quantization_config.zero_point: False; opgen loads True"),
    ("bitsandbytes", {"load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
     "quantization_config.bnb_4bit_quant_type: 'int4'; opgen loads 'nf4' or 'fp4'"),
    ("bitnet", {"quantization_mode": "online"}, "quantization_config.quantization_mode: 'online'"),
    ("bitnet", {"use_rms_norm": True}, "quantization_config.use_rms_norm: true"),
    ("compressed-tensors", {}, "quantization_config.config_groups: missing or empty"),
    ("compressed-tensors", {"format": "pack-quantized", "config_groups": {"g": {"weights": {
        "type": "int", "num_bits": 4, "strategy": "tensor"}}}},
     "quantization_config.config_groups.g.weights.strategy: 'tensor'; opgen loads 'group' or 'channel'"),
    ("compressed-tensors", {"format": "pack-quantized", "config_groups": {"g": {"weights": {
        "type": "int", "num_bits": 4, "strategy": "group", "group_size": -1}}}},
     "quantization_config.config_groups.g.weights.group_size: -1 with strategy 'group'"),
])
def test_config_errors_name_the_field(method, q, msg):
    with pytest.raises(hf.CheckpointError) as ei:
        hf.FORMATS[method](q, SRC, hf.Target(torch.float16))
    assert str(ei.value).startswith(f"{SRC}: {msg}")
