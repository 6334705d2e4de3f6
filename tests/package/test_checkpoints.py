"""Loading real checkpoint layouts (opgen.checkpoints): numpy only, CPU.

Each tiny checkpoint is built here *independently*, with the packing loop of
the project that writes it (AutoGPTQ, AutoAWQ, bitsandbytes, HF transformers
BitNet), never with opgen's packer; after conversion, the spec's reference
dequantization must equal the project's own dequantization formula exactly.
"""
import json
import subprocess
import sys
import zlib

import numpy as np
import pytest

from opgen import checkpoints as ck
from opgen.codegen.resolve import as_spec
from opgen.codegen import reference as R
from opgen.codegen.quantize_weight import quantize

N, K, G = 64, 256, 128


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))


def _error(fn, *args, **kw) -> str:
    with pytest.raises(ValueError) as ei:
        fn(*args, **kw)
    return str(ei.value)


def test_import_opgen_does_not_import_torch():
    code = "import sys, opgen, opgen.checkpoints; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- GPTQ: AutoGPTQ QuantLinear.pack -------------------------------------------------------


def gptq_checkpoint(rng, v1: bool, sym: bool = False) -> dict:
    """qweight [K/8, N]: row i holds intweight rows 8i..8i+7, row 8i+j in
    bits 4j..; qzeros [K/G, N/8]: column c holds zeros 8c..8c+7 (v1: z - 1)."""
    q = rng.integers(0, 16, size=(K, N)).astype(np.uint32)             # [K, N] codes
    z = np.full((K // G, N), 8) if sym else rng.integers(1, 16, size=(K // G, N))
    stored_z = (z - 1 if v1 else z).astype(np.uint32)
    qweight = np.zeros((K // 8, N), np.uint32)
    for j in range(8):
        qweight |= q[j::8] << (4 * j)
    qzeros = np.zeros((K // G, N // 8), np.uint32)
    for j in range(8):
        qzeros |= stored_z[:, j::8] << (4 * j)
    scales = (rng.uniform(0.5, 1.5, size=(K // G, N)) / 64).astype(np.float16)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales,
            "g_idx": np.arange(K, dtype=np.int32) // G,
            "bias": rng.standard_normal(N).astype(np.float16)}


def gptq_dequant(st: dict, v1: bool) -> np.ndarray:
    """AutoGPTQ's dequant: W[k, n] = (q - (z_stored + v1)) * s[g_idx[k], n], as [N, K]."""
    u = st["qweight"].view(np.uint32)
    q = np.stack([(u >> (4 * j)) & 0xF for j in range(8)], axis=1).reshape(K, N)
    uz = st["qzeros"].view(np.uint32)
    z = np.stack([(uz >> (4 * j)) & 0xF for j in range(8)], axis=2).reshape(K // G, N)
    z = z.astype(np.float32) + (1 if v1 else 0)
    g = st["g_idx"]
    return ((q.astype(np.float32) - z[g]) * st["scales"].astype(np.float32)[g]).T


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("sym", [False, True])
def test_gptq(version, sym):
    """By default into the as-stored spec, the tensors passed through; with
    spec= the repacked one, moved there (codegen.transcode)."""
    st = gptq_checkpoint(_rng(f"gptq{version}{sym}"), version == 1, sym)
    assert ck.FORMATS[f"gptq_v{version}"] == f"gptq_v{version}_w4a16_g128"
    for name in (f"gptq_v{version}_w4a16_g128", f"gptq_v{version}_w4a16_g128_repacked"):
        t = ck.from_gptq(st, version, N, K, group=G, **({} if not name.endswith("repacked") else {"spec": name}))
        spec = as_spec(name)
        assert set(t) == {"qweight", "scales", "zeros", "bias"}
        assert np.array_equal(R.dequantize(spec, t, N, K), gptq_dequant(st, version == 1))
        if name == ck.FORMATS[f"gptq_v{version}"]:
            assert np.array_equal(t["qweight"], st["qweight"])


@pytest.mark.parametrize("sym", [False, True])
def test_gptq_repacked(sym):
    """Into gptq_v2_w4a16_g128_repacked: qweight repacked to [N, K/8] in the
    interleaved order (word w of row n holds k = 8w + 0, 2, 4, 6, 1, 3, 5, 7
    in its fields 0..7), scales and qzeros passed through, the same weights."""
    st = gptq_checkpoint(_rng(f"gptq_repacked{sym}"), False, sym)
    t = ck.from_gptq(st, 2, N, K, spec="gptq_v2_w4a16_g128_repacked")
    spec = as_spec("gptq_v2_w4a16_g128_repacked")
    assert t["qweight"].shape == (N, K // 8) and t["qweight"].dtype == np.int32
    assert np.array_equal(R.dequantize(spec, t, N, K), gptq_dequant(st, False))
    u = st["qweight"].view(np.uint32)
    q = np.stack([(u >> (4 * j)) & 0xF for j in range(8)], axis=1).reshape(K, N)   # [K, N]
    word = t["qweight"].view(np.uint32)[5, 3]                 # row 5, k = 24 .. 31
    assert [int(word >> (4 * f)) & 0xF for f in range(8)] == [int(q[24 + j, 5]) for j in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert t["zeros"] is st["qzeros"] or np.array_equal(t["zeros"], st["qzeros"])
    spec2, t2 = ck.convert("gptq_v2", st, N, K, spec="gptq_v2_w4a16_g128_repacked")
    assert spec2 == spec and np.array_equal(t2["qweight"], t["qweight"])
    # v1 zeros (z - 1) are not what the v2 spec stores
    assert _error(ck.from_gptq, st, 1, N, K, spec="gptq_v2_w4a16_g128_repacked").startswith(
        "spec: gptq_v2_w4a16_g128_repacked does not store this checkpoint's weight")
    assert "b.zero.offset: 1 vs 0" in _error(ck.from_gptq, st, 1, N, K, spec="gptq_v2_w4a16_g128_repacked")
    # AWQ's storage of the same meaning is another layout: moved there too
    t3 = ck.from_gptq(st, 2, N, K, spec="awq_w4a16_g128")
    assert np.array_equal(R.dequantize(as_spec("awq_w4a16_g128"), t3, N, K), gptq_dequant(st, False))
    # a shape error names the checkpoint's layout, not the repacked one
    assert "[K/8, N]" in _error(ck.from_gptq, st, 2, N * 2, K // 2, spec="gptq_v2_w4a16_g128_repacked")


def test_gptq_uint32_storage_is_accepted():
    st = gptq_checkpoint(_rng("gptq-u32"), v1=False)
    st["qweight"], st["qzeros"] = st["qweight"].view(np.uint32), st["qzeros"].view(np.uint32)
    t = ck.from_gptq(st, 2, N, K)
    assert t["qweight"].dtype == np.int32 and t["zeros"].dtype == np.int32
    assert np.array_equal(R.dequantize(as_spec(ck.FORMATS["gptq_v2"]), t, N, K),
                          gptq_dequant(st, v1=False))


def test_gptq_act_order_is_refused():
    st = gptq_checkpoint(_rng("gptq-act"), v1=False)
    st["g_idx"] = _rng("perm").permutation(st["g_idx"])
    msg = _error(ck.from_gptq, st, 2, N, K)
    assert msg.startswith("g_idx: act-order") and "desc_act=False" in msg


def test_gptq_mismatches_name_the_tensor():
    st = gptq_checkpoint(_rng("gptq-bad"), v1=False)
    # qzeros left unpacked: [K/G, N] instead of [K/G, N/8]
    bad = dict(st, qzeros=np.zeros((K // G, N), np.int32))
    assert _error(ck.from_gptq, bad, 2, N, K) == (
        f"qzeros: shape [2, 64], expected [2, 8] = [K/128, N/8] for N={N}, K={K}, group 128")
    bad = dict(st, qweight=st["qweight"].astype(np.int64))
    assert _error(ck.from_gptq, bad, 2, N, K).startswith("qweight: dtype int64, expected int32")
    bad = {k: v for k, v in st.items() if k != "scales"}
    assert _error(ck.from_gptq, bad, 2, N, K).startswith("scales: missing")
    bad = dict(st, scales=np.zeros((K // 64, N), np.float16))        # a group-64 checkpoint
    assert _error(ck.from_gptq, bad, 2, N, K).startswith("scales: shape [4, 64], expected [2, 64]")
    assert "group 64" in _error(ck.from_gptq, st, 2, N, K, group=64)
    assert "[K/8, N]" in _error(ck.from_gptq, st, 2, N * 2, K // 2)  # wrong layer shape
    bad = dict(st, g_idx=np.arange(K + 1))
    assert _error(ck.from_gptq, bad, 2, N, K).startswith("g_idx: shape [257]")
    assert _error(ck.from_gptq, st, 3, N, K).startswith("version:")


def test_brief_example_message():
    """Unpacked qzeros of a 512 x 4096 layer."""
    st = {"qweight": np.zeros((4096 // 8, 512), np.int32), "scales": np.zeros((32, 512), np.float16),
          "qzeros": np.zeros((32, 512), np.int32)}
    assert _error(ck.from_gptq, st, 2, 512, 4096).startswith(
        "qzeros: shape [32, 512], expected [32, 64] = [K/128, N/8] for N=512, K=4096, group 128")


# --- AWQ: AutoAWQ WQLinear_GEMM.from_linear -----------------------------------------------

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_pack(x_kn: np.ndarray) -> np.ndarray:
    """[R, C] -> [R, C/8]: bit field i of column c holds column 8c + order_map[i]."""
    x = x_kn.astype(np.uint32)
    out = np.zeros((x.shape[0], x.shape[1] // 8), np.uint32)
    for col in range(x.shape[1] // 8):
        for i in range(8):
            out[:, col] |= x[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    return out.view(np.int32)


def awq_unpack(packed: np.ndarray) -> np.ndarray:
    """AutoAWQ unpack_awq + reverse_awq_order."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    f = (packed.view(np.uint32)[:, :, None] >> shifts[None, None, :]) & 0xF
    return f[:, :, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(packed.shape[0], -1)


def test_awq():
    rng = _rng("awq")
    q, z = rng.integers(0, 16, size=(K, N)), rng.integers(0, 16, size=(K // G, N))
    st = {"qweight": awq_pack(q), "qzeros": awq_pack(z),
          "scales": (rng.uniform(0.5, 1.5, size=(K // G, N)) / 64).astype(np.float16)}
    t = ck.from_awq(st, N, K)
    g = np.arange(K) // G
    want = ((awq_unpack(st["qweight"]).astype(np.float32) - awq_unpack(st["qzeros"])[g])
            * st["scales"].astype(np.float32)[g]).T
    assert np.array_equal(R.dequantize(as_spec("awq_w4a16_g128"), t, N, K), want)
    assert "bias" not in t
    # spec= another storage of the same weight: moved there (GPTQ v2's)
    t2 = ck.from_awq(st, N, K, spec="gptq_v2_w4a16_g128_repacked")
    assert np.array_equal(R.dequantize(as_spec("gptq_v2_w4a16_g128_repacked"), t2, N, K), want)
    # a GPTQ-layout qweight handed to the AWQ loader is refused by its shape
    gptq = gptq_checkpoint(rng, v1=False)
    msg = _error(ck.from_awq, dict(st, qweight=gptq["qweight"]), N, K)
    assert msg.startswith("qweight: shape [32, 64], expected [256, 8] = [K, N/8]")


# --- bitsandbytes NF4: quantize_4bit / Params4bit -----------------------------------------

NF4_VALUES = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)


def bnb_checkpoint(rng, blocksize=64) -> dict:
    """The flat [N*K] codes two per byte, even index in the high nibble,
    stored [N*K/2, 1]; absmax float32 per block of `blocksize` flat elements."""
    codes = rng.integers(0, 16, size=N * K).astype(np.uint8)
    weight = ((codes[0::2] << 4) | codes[1::2]).reshape(-1, 1)
    absmax = rng.uniform(0.1, 2.0, size=N * K // blocksize).astype(np.float32)
    return {"weight": weight, "absmax": absmax, "shape": (N, K), "blocksize": blocksize}


def bnb_dequant(st: dict) -> np.ndarray:
    flat = st["weight"].reshape(-1)
    codes = np.empty(flat.size * 2, np.uint8)
    codes[0::2], codes[1::2] = flat >> 4, flat & 0xF
    return (NF4_VALUES[codes] * np.repeat(st["absmax"], st["blocksize"])).reshape(N, K)


def bnb_serialized(st: dict, **extra_meta) -> dict:
    """What Linear4bit.state_dict() writes: weight.* keys and the non-tensor
    quant state as a uint8 tensor of JSON (bnb.utils.pack_dict_to_tensor)."""
    meta = {"quant_type": "nf4", "blocksize": st["blocksize"], "dtype": "float16",
            "shape": list(st["shape"]), **extra_meta}
    packed = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
    qt = meta["quant_type"]
    return {"weight": st["weight"], "weight.absmax": st["absmax"], "weight.quant_map": NF4_VALUES,
            f"weight.quant_state.bitsandbytes__{qt}": packed}


@pytest.mark.parametrize("form", ["plain", "quant_shape", "serialized"])
def test_bnb_nf4(form):
    st = bnb_checkpoint(_rng("nf4"))
    given = st
    if form == "quant_shape":
        given = {"weight": st["weight"], "absmax": st["absmax"], "quant_shape": st["shape"],
                 "blocksize": 64}
    elif form == "serialized":
        given = bnb_serialized(st)
    t = ck.from_bnb_nf4(given, N, K)
    assert t["qweight"].shape == (N, K // 2) and t["scales"].shape == (N, K // 64)
    assert np.array_equal(R.dequantize(as_spec("bnb_nf4"), t, N, K), bnb_dequant(st))


def test_bnb_nf4_refusals():
    st = bnb_checkpoint(_rng("nf4-bad"))
    nested = dict(st, absmax=st["absmax"].astype(np.uint8), nested_absmax=np.ones(4, np.float32))
    assert _error(ck.from_bnb_nf4, nested, N, K).startswith("absmax: double-quantized")
    ser = bnb_serialized(st, nested_blocksize=256, nested_offset=0.1)
    assert _error(ck.from_bnb_nf4, ser, N, K).startswith("absmax: double-quantized")
    assert _error(ck.from_bnb_nf4, dict(st, absmax=st["absmax"].astype(np.uint8)), N, K) \
        .startswith("absmax: uint8, i.e. double-quantized")
    assert "'fp4'" in _error(ck.from_bnb_nf4, bnb_serialized(st, quant_type="fp4"), N, K)
    st128 = bnb_checkpoint(_rng("nf4-128"), blocksize=128)
    assert _error(ck.from_bnb_nf4, st128, N, K).startswith("blocksize: 128")
    assert _error(ck.from_bnb_nf4, st, N, 2 * K).startswith("shape: quant state says [64, 256]")
    assert _error(ck.from_bnb_nf4, dict(st, absmax=st["absmax"][:-1]), N, K).startswith("absmax: 255")
    assert _error(ck.from_bnb_nf4, {k: v for k, v in st.items() if k != "absmax"}, N, K) \
        .startswith("absmax: missing")
    assert _error(ck.from_bnb_nf4, dict(st, absmax=st["absmax"].astype(np.float16)), N, K) \
        .startswith("absmax: dtype float16, expected float32")
    wrong_map = dict(bnb_serialized(st), **{"weight.quant_map": np.linspace(-1, 1, 16)})
    assert _error(ck.from_bnb_nf4, wrong_map, N, K).startswith("quant_map:")


# --- BitNet: HF transformers integrations/bitnet.py pack_weights ---------------------------


def hf_bitnet_pack(t_nk: np.ndarray) -> np.ndarray:
    """packed[: rows] |= (t[i*rows:(i+1)*rows] + 1) << 2i, rows = N/4."""
    u = (t_nk + 1).astype(np.uint8)
    rows = u.shape[0] // 4
    packed = np.zeros((rows, u.shape[1]), np.uint8)
    for i in range(4):
        packed |= u[i * rows:(i + 1) * rows] << (2 * i)
    return packed


def hf_bitnet_unpack(packed: np.ndarray) -> np.ndarray:
    rows = packed.shape[0]
    out = np.zeros((rows * 4, packed.shape[1]), np.float32)
    for i in range(4):
        out[i * rows:(i + 1) * rows] = (packed >> (2 * i)) & 3
    return out - 1


def spec_bitnet_pack(t_nk: np.ndarray) -> np.ndarray:
    """The bitnet_b158 spec: codes t + 1, four per byte along K, field i = element 4j + i."""
    c = (t_nk + 1).astype(np.uint8)
    out = np.zeros((c.shape[0], c.shape[1] // 4), np.uint8)
    for i in range(4):
        out |= c[:, i::4] << (2 * i)
    return out


@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16"])
def test_bitnet_hf(scale_dtype):
    rng = _rng("bitnet" + scale_dtype)
    tern = rng.integers(-1, 2, size=(N, K))
    ws = np.array([27.3], np.float32)         # HF stores 1 / mean|W|: it divides
    if scale_dtype == "bfloat16":              # as opgen's numpy bf16: uint16 bits
        ws = (ws.view(np.uint32) >> 16).astype(np.uint16)
        ws_f32 = (ws.astype(np.uint32) << 16).view(np.float32)
    else:
        ws_f32 = ws
    st = {"weight": hf_bitnet_pack(tern), "weight_scale": ws}
    t = ck.from_bitnet_hf(st, N, K)
    assert np.array_equal(t["qweight"], spec_bitnet_pack(tern))           # repacked along K
    want = hf_bitnet_unpack(st["weight"]) / ws_f32[0]                      # HF: y / weight_scale
    assert np.array_equal(R.dequantize(as_spec("bitnet_b158"), t, N, K), want)


def test_bitnet_hf_refusals():
    tern = _rng("bitnet-bad").integers(-1, 2, size=(N, K))
    st = {"weight": hf_bitnet_pack(tern), "weight_scale": np.array([2.0], np.float32)}
    bad = dict(st, weight=st["weight"].copy())
    bad["weight"][3, 5] |= 0b11 << 4                                       # field 2 = 3
    assert _error(ck.from_bitnet_hf, bad, N, K) == (
        f"weight: 2-bit field 3 (row {3 + 2 * N // 4}, column 5) is not a ternary code "
        f"(HF BitNet stores value + 1 in 0..2)")
    msg = _error(ck.from_bitnet_hf, dict(st, weight=spec_bitnet_pack(tern)), N, K)
    assert msg.startswith("weight: shape [64, 64], expected [16, 256] = [N/4, K]")
    assert _error(ck.from_bitnet_hf, {"weight": st["weight"]}, N, K).startswith("weight_scale: missing")
    assert _error(ck.from_bitnet_hf, dict(st, weight_scale=np.zeros(1, np.float32)), N, K) \
        .startswith("weight_scale: 0.0 is not a positive")


# --- dispatch and helpers ---------------------------------------------------------------


def test_convert_and_sub_state():
    st = gptq_checkpoint(_rng("convert"), v1=True)
    whole = {f"model.layers.0.mlp.up_proj.{k}": v for k, v in st.items()}
    whole["model.layers.0.mlp.down_proj.qweight"] = np.zeros(1)
    layer = ck.sub_state(whole, "model.layers.0.mlp.up_proj.")
    assert set(layer) == set(st)
    spec, t = ck.convert("gptq_v1", layer, N, K)
    assert spec.name == "gptq_v1_w4a16_g128"
    assert np.array_equal(R.dequantize(spec, t, N, K), gptq_dequant(st, v1=True))
    assert _error(ck.convert, "exl2", layer, N, K).startswith("format 'exl2': unknown")


def test_validate_tensors_extra_and_bias():
    spec = as_spec("bnb_nf4")
    t = quantize(spec, _rng("v").standard_normal((N, K)).astype(np.float32))
    ck.validate_tensors(spec, t, N, K)
    assert _error(ck.validate_tensors, spec, dict(t, zeros=t["scales"]), N, K) \
        .startswith("zeros: spec bnb_nf4 has no zeros")
    assert _error(ck.validate_tensors, spec, dict(t, bias=np.zeros(N + 1)), N, K) \
        .startswith("bias: shape [65], expected [64]")


def test_n_axes_and_stack_refusal():
    """The axis of each stored tensor that grows with N (what stacking
    siblings joins along); a tensor scale has none, so its layers do not
    stack, and stack_refusal says why."""
    assert ck.n_axes(as_spec("gptq_v2_w4a16_g128")) == {"qweight": 1, "scales": 1, "zeros": 1}
    assert ck.n_axes(as_spec("bnb_nf4")) == {"qweight": 0, "scales": 0}
    assert ck.stack_refusal(as_spec("w4a16_sym_g128")) is None
    assert ck.stack_refusal(as_spec("bitnet_b158")) == (
        "fuse: bitnet_b158: its scales tensor is one for the whole weight (no n axis), so stacked "
        "siblings cannot each keep their own")
