"""opgen.hf_checkpoint: quantized Hugging Face checkpoint directories, built
here (no download), loaded into transformers models on CPU (the formats'
units: test_hf_formats.py).

Each checkpoint is a tiny Llama (or gpt-oss, BitNet) whose layers are
quantized with the real libraries where they install on a CPU machine
(bitsandbytes quantizes NF4/FP4, compressed-tensors packs pack-quantized,
transformers packs BitNet and dequantizes gpt-oss's MXFP4) and with each
format's published packing otherwise (GPTQ, AWQ: written here, not opgen's
packer). The quantization configs are the libraries' own (transformers'
GPTQConfig & co., compressed-tensors' QuantizationConfig). Each test checks
that every served layer holds exactly the weights the library dequantizes,
that the model's logits (QuantLinear on CPU runs the numpy reference) match
the same model holding those weights in float, and the report.
"""
import json
import subprocess
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (transformers requires safetensors)
from torch import nn  # noqa: E402

import opgen.torch as ot  # noqa: E402
from opgen import hf_checkpoint as hc  # noqa: E402
from opgen.fused_linear import FusedPart  # noqa: E402
from opgen.codegen import reference as R  # noqa: E402

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))


# --- tiny models and checkpoint directories ---------------------------------------------------

def llama_config(hidden=128, intermediate=256, heads=4, kv=2, layers=2, **kw) -> dict:
    """Shapes every shipped 4-bit spec accepts: q/o 128x128, k/v 64x128,
    gate/up 256x128, down 128x256; lm_head (vocab 64) stays float."""
    return transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        num_key_value_heads=kv, num_hidden_layers=layers, vocab_size=64, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=1, **kw).to_dict()


def float_model(config: dict, weights=None, seed: int = 0) -> nn.Module:
    """The float model of `config`: transformers' random init, weights scaled
    up so that the logits are far from zero; `weights` replaces tensors."""
    torch.manual_seed(seed)
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.mul_(5.0)
        for name, w in (weights or {}).items():
            model.get_parameter(name).copy_(torch.as_tensor(w))
    return model.eval()


def linears(config: dict):
    """(weight name, N, K) of the decoder layers' projections."""
    for i in range(config["num_hidden_layers"]):
        for p in PROJ:
            yield f"model.layers.{i}.{p}", *_shape(config, p)


def _shape(config, proj):
    H, I = config["hidden_size"], config["intermediate_size"]
    hd = config.get("head_dim") or H // config["num_attention_heads"]
    return {"self_attn.q_proj": (config["num_attention_heads"] * hd, H),
            "self_attn.k_proj": (config["num_key_value_heads"] * hd, H),
            "self_attn.v_proj": (config["num_key_value_heads"] * hd, H),
            "self_attn.o_proj": (H, config["num_attention_heads"] * hd),
            "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}[proj]


def write_checkpoint(path, config: dict, quant_config: dict, tensors: dict, shards: int = 2):
    """config.json (with quantization_config) and the tensors in `shards`
    safetensors files with an index (one file: model.safetensors)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(dict(config, quantization_config=quant_config)))
    tensors = {k: v.contiguous() if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
               for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        f = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, str(path / f))
        weight_map.update({n: f for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
         "weight_map": weight_map}))
    return path


def quantized_checkpoint(path, config, quant_config, quantize_layer, shards=2, skip=()):
    """The float model's tensors with each projection (but `skip`) replaced by
    quantize_layer(w [N, K] float32 numpy, name) -> (its tensors by local
    name, the library's dequantized weight). Returns the library's weights."""
    model = float_model(config)
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        del tensors["lm_head.weight"]                 # as transformers saves a tied head
    lib = {}
    for name, N, K in linears(config):
        if any(name.endswith(s) for s in skip):
            continue
        w = tensors.pop(name + ".weight").numpy()
        assert w.shape == (N, K)
        layer, lib[name] = quantize_layer(w, name)
        tensors.update({f"{name}.{k}": v for k, v in layer.items()})
    write_checkpoint(path, config, quant_config, tensors, shards)
    return lib


def served_weight(mod: nn.Module) -> np.ndarray:
    """The float [N, K] weight a loaded layer computes with."""
    if isinstance(mod, hc.PermutedInput):
        w = np.empty((mod.out_features, mod.in_features), np.float32)
        w[:, mod.perm.numpy()] = served_weight(mod.layer)
        return w
    if isinstance(mod, FusedPart):          # (its rows of the stacked layer)
        lo, hi = mod.shared.bounds[mod.index]
        return served_weight(mod.shared.wide)[lo:hi]
    if isinstance(mod, ot.QuantLinear):
        t = {k: ot.to_numpy(getattr(mod, k)) for k in ("qweight", "scales", "zeros")
             if getattr(mod, k) is not None}
        return R.dequantize(mod.kernel_spec, t, mod.out_features, mod.in_features)
    return mod.weight.detach().float().numpy()


def check_load(path, config, lib, dtype=torch.float32, rtol=0.0, tol=2e-2, **kw):
    """Load (kw: load_quantized's options); each quantized layer's weights ==
    the library's (rtol: the library rounds them); logits match a float model
    holding the library's weights. Returns (model, report)."""
    model, report = hc.load_quantized(path, dtype=dtype, **kw)
    for name, want in lib.items():
        got = served_weight(model.get_submodule(name))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)
    ref = float_model(config, {f"{n}.weight": w for n, w in lib.items()})
    ids = torch.tensor([[3, 17, 5, 42, 8, 11]])
    with torch.no_grad():
        got, want = model(ids).logits.float(), ref(ids).logits
    assert torch.isfinite(got).all()
    err = float((got - want).abs().max() / want.abs().max())
    assert err < tol, err
    return model, report


# --- GPTQ and AWQ: the published packing, written here ------------------------------------------

def rtn_asym(w: np.ndarray, g_idx: np.ndarray, n_groups: int):
    """Round-to-nearest 4-bit with zero points per (group, column): codes
    [N, K], scales fp16 [groups, N], zeros [groups, N] (as GPTQ/AWQ store them)."""
    N, K = w.shape
    scales, zeros = np.ones((n_groups, N), np.float32), np.zeros((n_groups, N), np.int64)
    for g in range(n_groups):
        cols = w[:, g_idx == g]
        lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
        s = np.where(hi > lo, (hi - lo) / 15, 1.0)
        scales[g], zeros[g] = s, np.round(-lo / s)
    scales = scales.astype(np.float16)
    s_k, z_k = scales.astype(np.float32)[g_idx].T, zeros[g_idx].T          # per element [N, K]
    q = np.clip(np.round(w / s_k) + z_k, 0, 15).astype(np.int64)
    return q, scales, zeros, ((q - z_k) * s_k).astype(np.float32)


def gptq_layer(w, G, v1, act_order_rng=None):
    """AutoGPTQ's QuantLinear.pack: qweight [K/8, N] (row i holds rows 8i..8i+7
    of the [K, N] codes, row 8i+j in bits 4j), qzeros [K/G, N/8] (column c
    holds zeros 8c..8c+7; v1 stores z - 1), scales [K/G, N], g_idx [K]
    (act-order: the group of row k is its position in the order // G)."""
    N, K = w.shape
    G = K if G == -1 else G
    g_idx = np.arange(K) // G
    if act_order_rng is not None:
        g_idx = np.empty(K, np.int64)
        g_idx[act_order_rng.permutation(K)] = np.arange(K) // G
    q, scales, zeros, deq = rtn_asym(w, g_idx, K // G)
    intweight = q.T.astype(np.uint32)
    qweight = np.zeros((K // 8, N), np.uint32)
    for j in range(8):
        qweight |= intweight[j::8] << (4 * j)
    stored = ((zeros - 1 if v1 else zeros) & 0xF).astype(np.uint32)
    qzeros = np.zeros((K // G, N // 8), np.uint32)
    for j in range(8):
        qzeros |= stored[:, j::8] << (4 * j)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales,
            "g_idx": g_idx.astype(np.int32)}, deq


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_layer(w, G):
    """AutoAWQ's WQLinear_GEMM: qweight [K, N/8] and qzeros [K/G, N/8], bit
    field i of word c holding column 8c + AWQ_ORDER[i]; scales [K/G, N]."""
    N, K = w.shape
    q, scales, zeros, deq = rtn_asym(w, np.arange(K) // G, K // G)
    qweight = np.zeros((K, N // 8), np.uint32)
    qzeros = np.zeros((K // G, N // 8), np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        qweight |= q.T[:, col::8].astype(np.uint32) << (4 * i)
        qzeros |= zeros[:, col::8].astype(np.uint32) << (4 * i)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales}, deq


def gptq_config(group=128, desc_act=False, fmt="gptq"):
    return transformers.GPTQConfig(bits=4, group_size=group, desc_act=desc_act,
                                   checkpoint_format=fmt).to_dict()


@pytest.mark.parametrize("fmt, group", [("gptq", 128), ("gptq_v2", 32), ("gptq_v2", -1)])
def test_gptq(tmp_path, fmt, group):
    config = llama_config()
    lib = quantized_checkpoint(tmp_path, config, gptq_config(group, fmt=fmt),
                               lambda w, name: gptq_layer(w, group, v1=fmt == "gptq"))
    # v1 loads as a float16 model (the default dtype; transformers runs it on CPU too)
    model, report = check_load(tmp_path, config, lib, dtype=torch.float16 if fmt == "gptq" else torch.float32)
    v = 1 if fmt == "gptq" else 2
    assert report.format == f"gptq v{v}, 4-bit, group {group}"
    assert set(report.served) == set(lib) and not report.dequantized and not report.unused
    assert report.unquantized == ["lm_head"]
    specs = set(report.served.values())
    if group == 128:
        assert specs == {f"gptq_v{v}_w4a16_g128"}                  # the shipped spec
    elif group == 32:
        assert specs == {"gptq_v2_w4a16_g32"}                      # a user spec of that group
    else:                                                          # per channel: one group of K
        assert specs == {"gptq_v2_w4a16_g128", "gptq_v2_w4a16_g256"}   # K = 128 and 256
    q = model.get_submodule("model.layers.0.self_attn.o_proj")      # (no sibling: not stacked)
    assert isinstance(q, ot.QuantLinear) and q.spec.b.scale.group == (128 if group == -1 else group)
    text = str(report)
    assert text.splitlines()[1].startswith("14 layer(s) run on opgen")
    assert "1 layer(s) float in the checkpoint: lm_head" in text


def test_fuse_stacks_the_served_siblings(tmp_path):
    """By default (fuse=True) each decoder layer's q / k / v and gate / up
    run as one stacked layer (the report says so); the logits are the
    unfused model's (fuse=False). pdl=True reaches every served layer,
    stacked ones too."""
    config = llama_config()
    quantized_checkpoint(tmp_path, config, gptq_config(32, fmt="gptq_v2"),
                         lambda w, name: gptq_layer(w, 32, v1=False))
    plain, plain_report = hc.load_quantized(tmp_path, dtype=torch.float32, fuse=False)
    assert not plain_report.fused
    assert isinstance(plain.get_submodule("model.layers.0.self_attn.q_proj"), ot.QuantLinear)
    fused, report = hc.load_quantized(tmp_path, dtype=torch.float32, pdl=True)
    attn = "model.layers.{}.self_attn.{}_proj"
    assert report.fused[:2] == [tuple(attn.format(0, p) for p in "qkv"),
                                ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")]
    assert len(report.fused) == 2 * config["num_hidden_layers"] and "run as one layer each" in str(report)
    down = fused.get_submodule("model.layers.0.mlp.down_proj")
    assert down.pdl and fused.get_submodule("model.layers.0.mlp.up_proj").shared.wide.pdl
    ids = torch.tensor([[3, 17, 5, 42, 8, 11]])
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, plain(ids).logits)


def test_gptq_act_order_is_served_permuted(tmp_path):
    """desc_act: the rows of K sorted by group, the input gathered to match."""
    config = llama_config()
    rng = _rng("act-order")
    lib = quantized_checkpoint(tmp_path, config, gptq_config(32, desc_act=True, fmt="gptq_v2"),
                               lambda w, name: gptq_layer(w, 32, v1=False, act_order_rng=rng))
    model, report = check_load(tmp_path, config, lib)
    assert report.format.endswith("act-order") and set(report.served) == set(lib)
    layer = model.get_submodule("model.layers.1.mlp.down_proj")
    assert isinstance(layer, hc.PermutedInput) and layer.perm.dtype == torch.int64
    assert sorted(layer.perm.tolist()) == list(range(256))
    # fuse=True: permuted layers (each its own order of K) are not stacked, and the load works
    fused, report = hc.load_quantized(tmp_path, dtype=torch.float32, fuse=True)
    ids = torch.tensor([[3, 17, 5, 42]])
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, model(ids).logits)


def test_gptq_act_order_groups_of_unequal_size_run_in_float(tmp_path):
    """A g_idx no order of K turns into k // G: dequantized (with g_idx) into
    a float Linear, and the report says why."""
    config = llama_config(layers=1)

    def layer(w, name):
        t, deq = gptq_layer(w, 32, v1=False)
        if name.endswith("o_proj"):
            K = w.shape[1]
            g = np.minimum(np.arange(K) // 24, 3)[::-1].astype(np.int32)    # 24, 24, 24, 56 rows
            t["g_idx"] = g
            N = w.shape[0]
            u = t["qweight"].view(np.uint32)
            q = np.stack([(u >> (4 * j)) & 0xF for j in range(8)], 1).reshape(K, N).astype(np.float32)
            uz = t["qzeros"].view(np.uint32)
            z = np.stack([(uz >> (4 * j)) & 0xF for j in range(8)], 2).reshape(-1, N).astype(np.float32)
            deq = ((q - z[g]) * t["scales"].astype(np.float32)[g]).T     # AutoGPTQ's dequant
        return t, deq
    lib = quantized_checkpoint(tmp_path, config, gptq_config(32, desc_act=True, fmt="gptq_v2"), layer)
    model, report = check_load(tmp_path, config, lib)
    name = "model.layers.0.self_attn.o_proj"
    assert set(report.dequantized) == {name} and "unequal size" in report.dequantized[name]
    assert type(model.get_submodule(name)) is nn.Linear
    assert f"1 quantized layer(s) run in float:\n  {name}: act-order" in str(report)


def test_awq(tmp_path):
    """One safetensors file, no index; lm_head tied to the embedding (absent)."""
    config = llama_config(tie_word_embeddings=True)
    lib = quantized_checkpoint(tmp_path, config,
                               transformers.AwqConfig(bits=4, group_size=64).to_dict(),
                               lambda w, name: awq_layer(w, 64), shards=1)
    model, report = check_load(tmp_path, config, lib)
    assert report.format == "awq gemm, 4-bit, group 64"
    assert set(report.served.values()) == {"awq_w4a16_g64"} and len(report.served) == 14
    assert not report.unquantized and model.lm_head.weight is model.model.embed_tokens.weight


def test_layers_the_kernels_refuse_run_in_float(tmp_path):
    """AWQ's [K, N/8] storage needs N % 32: k/v_proj of 48 outputs are
    dequantized into float Linears, with the kernels' reason."""
    config = llama_config(hidden=96, intermediate=192, heads=6, kv=3)       # head_dim 16
    lib = quantized_checkpoint(tmp_path, config,
                               transformers.AwqConfig(bits=4, group_size=32).to_dict(),
                               lambda w, name: awq_layer(w, 32))
    model, report = check_load(tmp_path, config, lib)
    assert set(report.dequantized) == {f"model.layers.{i}.self_attn.{p}" for i in (0, 1)
                                       for p in ("k_proj", "v_proj")}
    why = report.dequantized["model.layers.0.self_attn.k_proj"]
    assert why.startswith("awq_w4a16_g32: ") and "32" in why
    assert len(report.served) == 10


def test_bfloat16_model(tmp_path):
    """A bfloat16 model runs specs with bfloat16 activations (user specs
    derived from the shipped ones)."""
    config = llama_config(layers=1)
    lib = quantized_checkpoint(tmp_path, config, gptq_config(128, fmt="gptq_v2"),
                               lambda w, name: gptq_layer(w, 128, v1=False))
    model, report = check_load(tmp_path, config, lib, dtype=torch.bfloat16, tol=6e-2)
    assert set(report.served.values()) == {"gptq_v2_w4a16_g128_bf16"}
    layer = model.get_submodule("model.layers.0.mlp.down_proj")
    assert layer.spec.a.dtype == "bfloat16" and model.lm_head.weight.dtype == torch.bfloat16


# --- bitsandbytes: the real library quantizes -------------------------------------------------

def bnb_layer(quant_type):
    F = pytest.importorskip("bitsandbytes.functional")

    def layer(w, name):
        packed, qs = F.quantize_4bit(torch.from_numpy(w).half(), blocksize=64, quant_type=quant_type,
                                     compress_statistics=False)
        saved = {"weight": packed, **{f"weight.{k}": v for k, v in qs.as_dict(packed=True).items()}}
        return saved, F.dequantize_4bit(packed, qs).float().numpy()
    return layer


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bitsandbytes(tmp_path, quant_type):
    config = llama_config()
    qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type).to_dict()
    lib = quantized_checkpoint(tmp_path, config, qc, bnb_layer(quant_type))
    # bitsandbytes dequantizes to float16 (and its CPU backend's FP4 table has 4 decimals)
    _, report = check_load(tmp_path, config, lib, rtol=2e-3)
    assert report.format == f"bitsandbytes {quant_type}"
    assert set(report.served.values()) == {"bnb_nf4" if quant_type == "nf4" else "bnb_fp4"}
    assert len(report.served) == 14


# --- compressed-tensors: the real library packs -----------------------------------------------

def ct_layer(bits, strategy, symmetric, group=32):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy,
                            **({"group_size": group} if strategy == "group" else {}))
    scheme = QuantizationScheme(targets=["Linear"], weights=args, format="pack-quantized")
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def layer(w, name):
        N, K = w.shape
        G = group if strategy == "group" else K
        wg = torch.from_numpy(w).reshape(N, K // G, G)
        if symmetric:
            scale = wg.abs().amax(-1) / qmax
            zp = None
        else:
            lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
            scale = (hi - lo) / (qmax - qmin)
            zp = (qmin - torch.round(lo / scale)).clamp(qmin, qmax).to(torch.int8)
        state = {"weight": torch.from_numpy(w).bfloat16(), "weight_scale": scale.bfloat16()}
        if zp is not None:
            state["weight_zero_point"] = zp
        packed = PackedQuantizationCompressor.compress(state, scheme)
        deq = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
        return packed, deq.float().numpy()
    return layer, scheme


@pytest.mark.parametrize("bits, strategy, symmetric", [
    (4, "group", True), (4, "group", False), (4, "channel", True), (4, "channel", False),
    (8, "channel", True), (8, "group", False)])
def test_compressed_tensors(tmp_path, bits, strategy, symmetric):
    layer, scheme = ct_layer(bits, strategy, symmetric)
    from compressed_tensors.quantization import QuantizationConfig
    config = llama_config()
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                            ignore=["lm_head"], quantization_status="compressed").model_dump()
    lib = quantized_checkpoint(tmp_path, config, qc, layer)
    # the library dequantizes in bfloat16 (the scale's dtype): opgen's exact
    # float32 weights rounded to bfloat16 are the library's
    model, report = hc.load_quantized(tmp_path, dtype=torch.float32)
    for name, want in lib.items():
        got = torch.from_numpy(served_weight(model.get_submodule(name))).bfloat16().float().numpy()
        assert np.array_equal(got, want), name
    check_load(tmp_path, config, lib, rtol=8e-3)              # a bfloat16 ulp
    kind = "g32" if strategy == "group" else "channel"
    want_spec = f"ct_w{bits}a16_{'sym' if symmetric else 'asym'}_{kind}_sbf16"
    assert set(report.served.values()) == {want_spec} and len(report.served) == 14
    assert report.format == f"compressed-tensors pack-quantized (int{bits} {strategy})"


def test_compressed_tensors_act_order(tmp_path):
    """Checkpoints of compressed-tensors' former actorder="group" carry
    weight_g_idx (the group of each row of K): served permuted, like GPTQ's."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationConfig
    _, scheme = ct_layer(4, "group", True)
    config = llama_config(layers=1)
    rng = _rng("ct-act-order")

    def layer(w, name):
        N, K = w.shape
        g_idx = np.empty(K, np.int64)
        g_idx[rng.permutation(K)] = np.arange(K) // 32
        scale = np.stack([np.abs(w[:, g_idx == g]).max(1) / 7 for g in range(K // 32)], 1)
        scale = torch.from_numpy(scale).bfloat16()
        s_k = scale.float().numpy()[:, g_idx]
        codes = np.clip(np.round(w / s_k), -8, 7).astype(np.int8)
        return ({"weight_packed": pack_to_int32(torch.from_numpy(codes), 4), "weight_scale": scale,
                 "weight_shape": torch.tensor([N, K]),
                 "weight_g_idx": torch.from_numpy(g_idx.astype(np.int32))},
                codes.astype(np.float32) * s_k)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized").model_dump()
    lib = quantized_checkpoint(tmp_path, config, qc, layer)
    model, report = check_load(tmp_path, config, lib)
    assert len(report.served) == 7
    assert isinstance(model.get_submodule("model.layers.0.mlp.down_proj"), hc.PermutedInput)


def test_compressed_tensors_config_groups_by_target(tmp_path):
    """Two config groups: attention by regex target (int8 channel), the rest
    by class (int4 group); a layer in `ignore` is float in the checkpoint."""
    attn, s_attn = ct_layer(8, "channel", True)
    mlp, s_mlp = ct_layer(4, "group", True)
    from compressed_tensors.quantization import QuantizationConfig
    config = llama_config(layers=1)
    s_attn.targets = ["re:.*self_attn\\..*_proj$"]
    qc = QuantizationConfig(config_groups={"attn": s_attn, "rest": s_mlp}, format="pack-quantized",
                            ignore=["lm_head", "model.layers.0.mlp.down_proj"]).model_dump()
    lib = quantized_checkpoint(tmp_path, config, qc,
                               lambda w, name: (attn if "self_attn" in name else mlp)(w, name),
                               skip=("down_proj",))
    _, report = check_load(tmp_path, config, lib, rtol=8e-3)
    assert report.served["model.layers.0.self_attn.q_proj"] == "ct_w8a16_sym_channel_sbf16"
    assert report.served["model.layers.0.mlp.up_proj"] == "ct_w4a16_sym_g32_sbf16"
    assert report.unquantized == ["model.layers.0.mlp.down_proj", "lm_head"]


# --- gpt-oss MXFP4 experts, BitNet: transformers' own code -----------------------------------

def gpt_oss_config():
    return transformers.GptOssConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        vocab_size=64, layer_types=["full_attention"], bos_token_id=0, eos_token_id=1,
        pad_token_id=2).to_dict()


def test_gpt_oss_mxfp4_experts(tmp_path):
    """gpt-oss stores its experts as *_blocks [E, N, K/32, 16] and *_scales
    [E, N, K/32]: not nn.Linear, so dequantized into the float parameters
    transformers holds ([E, K, N]), equal to transformers' own dequantizer;
    the report says so."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    config = gpt_oss_config()
    model = float_model(config)
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    rng = _rng("mxfp4")
    lib = {}
    for p in ("gate_up_proj", "down_proj"):
        key = f"model.layers.0.mlp.experts.{p}"
        E, K, N = tensors.pop(key).shape
        blocks = torch.from_numpy(rng.integers(0, 256, (E, N, K // 32, 16), dtype=np.uint8))
        scales = torch.from_numpy(rng.integers(122, 128, (E, N, K // 32), dtype=np.uint8))
        tensors.update({key + "_blocks": blocks, key + "_scales": scales})
        lib[key] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    write_checkpoint(tmp_path, config, transformers.Mxfp4Config().to_dict(), tensors)
    loaded, report = hc.load_quantized(tmp_path, dtype=torch.float32)
    for key, want in lib.items():
        assert torch.equal(loaded.get_parameter(key), want)
    assert report.format == "mxfp4 (gpt-oss)" and not report.served
    assert set(report.dequantized) == set(lib)
    assert "not nn.Linear" in report.dequantized["model.layers.0.mlp.experts.down_proj"]
    assert "model.layers.0.self_attn.q_proj" in report.unquantized
    ref = float_model(config, lib)
    ids = torch.tensor([[3, 17, 5, 42]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activations", ["int8", "float"])
def test_bitnet(tmp_path, activations):
    """HF BitNet (BitLinear, offline): ternary weights packed by transformers'
    pack_weights, weight_scale dividing; served by bitnet_b158_a8 (int8
    activations per token, as BitLinear runs them) or bitnet_b158."""
    from transformers.integrations.bitnet import pack_weights
    config = transformers.BitNetConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, bos_token_id=0, eos_token_id=1).to_dict()
    rng = _rng("bitnet")

    def layer(w, name):
        t = torch.from_numpy(rng.integers(-1, 2, w.shape)).to(torch.int8)
        scale = torch.tensor([4.0], dtype=torch.bfloat16)
        return ({"weight": pack_weights(t.clone()), "weight_scale": scale},
                (t.float() / scale.float()).numpy())
    lib = quantized_checkpoint(tmp_path, config, transformers.BitNetQuantConfig().to_dict(), layer)
    _, report = check_load(tmp_path, config, lib, bitnet_activations=activations)
    spec = {"int8": "bitnet_b158_a8", "float": "bitnet_b158"}[activations]
    assert set(report.served.values()) == {spec} and len(report.served) == 7
    assert ("BitLinear quantizes its input to int8 per token" in str(report)) == (activations == "float")
    assert report.fused == [] and "separate layers" not in str(report)     # (the default: where it can)
    # fuse=True: a tensor scale does not stack; the layers stay separate, the report says why
    _, report = hc.load_quantized(tmp_path, dtype=torch.float32, fuse=True, bitnet_activations=activations)
    assert report.fused == [] and len(report.served) == 7
    assert f"fuse: {spec}: its scales tensor is one for the whole weight" in str(report)
    assert "its siblings stay separate layers" in str(report)


# --- on the GPU: the generated kernels --------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")
@pytest.mark.parametrize("fmt", ["gptq_act_order", "awq", "nf4"])
def test_gpu_load_runs_the_kernels(tmp_path, fmt):
    """device="cuda": the layers' tensors move to the GPU first (their layout
    moved there), the kernels run, the logits match the CPU-loaded model's
    (numpy reference) within the kernels' tolerance."""
    config = llama_config()
    if fmt == "gptq_act_order":
        rng = _rng("gpu-act-order")
        qc, layer = (gptq_config(32, desc_act=True, fmt="gptq_v2"),
                     lambda w, name: gptq_layer(w, 32, v1=False, act_order_rng=rng))
    elif fmt == "awq":
        qc = transformers.AwqConfig(bits=4, group_size=128).to_dict()
        layer = lambda w, name: awq_layer(w, 128)  # noqa: E731
    else:
        qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4").to_dict()
        layer = bnb_layer("nf4")
    quantized_checkpoint(tmp_path, config, qc, layer)
    gpu, report = hc.load_quantized(tmp_path, device="cuda")
    cpu, _ = hc.load_quantized(tmp_path)
    assert len(report.served) == 14
    q = next(m for m in gpu.modules() if isinstance(m, ot.QuantLinear))
    assert q.qweight.is_cuda
    ids = torch.tensor([[3, 17, 5, 42, 8, 11]])
    with torch.no_grad():
        got, want = gpu(ids.cuda()).logits.float().cpu(), cpu(ids).logits.float()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2


# --- bad input: one error naming the file, the tensor or field, and the mismatch -------------

@pytest.fixture
def gptq_dir(tmp_path):
    config = llama_config(layers=1)
    quantized_checkpoint(tmp_path / "ck", config, gptq_config(32, fmt="gptq_v2"),
                         lambda w, name: gptq_layer(w, 32, v1=False))
    return tmp_path / "ck"


def _load_error(path) -> str:
    with pytest.raises(hc.CheckpointError) as ei:
        hc.load_quantized(path)
    return str(ei.value)


def _rewrite(path, change):
    """Apply change(tensors) to the shard holding the first tensor it names."""
    index = json.loads((path / "model.safetensors.index.json").read_text())
    for f in sorted(set(index["weight_map"].values())):
        t = load_file(str(path / f))
        if change(t):
            save_file(t, str(path / f))
            return f


def test_missing_shard(gptq_dir):
    (gptq_dir / "model-00002-of-00002.safetensors").unlink()
    msg = _load_error(gptq_dir)
    assert msg == (f"{gptq_dir / 'model-00002-of-00002.safetensors'}: no such file "
                   f"(named by model.safetensors.index.json)")


def test_wrong_shape(gptq_dir):
    key = "model.layers.0.mlp.up_proj.qzeros"

    def change(t):
        if key in t:
            t[key] = torch.zeros(8, 256, dtype=torch.int32)        # unpacked: [K/G, N]
            return True
    f = _rewrite(gptq_dir, change)
    assert _load_error(gptq_dir) == (f"{gptq_dir / f}: {key}: shape [8, 256], expected "
                                     f"[4, 32] = [K/32, N/8] for N=256, K=128, group 32")


def test_wrong_dtype(gptq_dir):
    key = "model.layers.0.self_attn.q_proj.qweight"

    def change(t):
        if key in t:
            t[key] = t[key].to(torch.int64)
            return True
    f = _rewrite(gptq_dir, change)
    assert _load_error(gptq_dir).startswith(f"{gptq_dir / f}: {key}: dtype int64, expected int32")


def test_float_tensor_of_the_wrong_shape(gptq_dir):
    key = "model.norm.weight"

    def change(t):
        if key in t:
            t[key] = torch.ones(64)
            return True
    f = _rewrite(gptq_dir, change)
    assert _load_error(gptq_dir).startswith(f"{gptq_dir / f}: {key}: shape [64], expected [128]")


def test_missing_tensor(gptq_dir):
    key = "model.layers.0.mlp.down_proj.scales"
    index_file = gptq_dir / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    f = index["weight_map"].pop(key)
    index_file.write_text(json.dumps(index))
    assert _load_error(gptq_dir) == (
        f"{gptq_dir / f}: model.layers.0.mlp.down_proj.scales: missing; spec gptq_v2_w4a16_g128 "
        f"with group 32 stores it as [8, 128] = [K/32, N] float16 for N=128, K=256, group 32")
    index["weight_map"][key] = f
    index["weight_map"]["model.layers.0.mlp.down_proj.extra"] = f        # the index lies
    index_file.write_text(json.dumps(index))
    assert _load_error(gptq_dir) == (f"{gptq_dir / f}: model.layers.0.mlp.down_proj.extra: not in "
                                     f"the file (1 tensor(s) model.safetensors.index.json places "
                                     f"there are not)")


@pytest.mark.parametrize("change, msg", [
    ({"quant_method": "hqq"}, "quantization_config.quant_method: 'hqq'; opgen loads gptq, awq, "),
    ({"bits": 3}, "quantization_config.bits: 3; opgen loads 4"),
    ({"checkpoint_format": "marlin", "format": "marlin"},
     "quantization_config.checkpoint_format: 'marlin'; opgen loads 'gptq' or 'gptq_v2'"),
    ({"group_size": 0}, "quantization_config.group_size: 0 is not a positive integer or -1"),
    (None, "quantization_config: missing (not a quantized checkpoint)"),
])
def test_bad_quantization_config(gptq_dir, change, msg):
    cfg_file = gptq_dir / "config.json"
    cfg = json.loads(cfg_file.read_text())
    if change is None:
        del cfg["quantization_config"]
    else:
        cfg["quantization_config"].update(change)
    cfg_file.write_text(json.dumps(cfg))
    assert _load_error(gptq_dir).startswith(f"{cfg_file}: {msg}")


@pytest.mark.parametrize("qc, msg", [
    ({"quant_method": "bitsandbytes", "load_in_8bit": True},
     "quantization_config.load_in_4bit: not true; opgen loads bitsandbytes 4-bit"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True},
     "quantization_config.bnb_4bit_use_double_quant: true"),
    ({"quant_method": "awq", "version": "gemv"}, "quantization_config.version: 'gemv'"),
    ({"quant_method": "bitnet", "linear_class": "autobitlinear"},
     "quantization_config.linear_class: 'autobitlinear'; opgen loads 'bitlinear'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}},
     "quantization_config.config_groups.g.format: 'float-quantized'; opgen loads 'pack-quantized'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                          "group_size": 128},
                              "input_activations": {"num_bits": 8}}}},
     "quantization_config.config_groups.g.input_activations: quantized activations"),
])
def test_unsupported_formats(tmp_path, qc, msg):
    write_checkpoint(tmp_path, llama_config(layers=1), qc, {"x": torch.zeros(1)}, shards=1)
    assert _load_error(tmp_path).startswith(f"{tmp_path / 'config.json'}: {msg}")


def test_not_a_checkpoint(tmp_path):
    assert _load_error(tmp_path / "nothere").endswith("nothere: not a directory (give a checkpoint "
                                                      "directory)")
    assert _load_error(tmp_path) == f"{tmp_path / 'config.json'}: no such file"
    (tmp_path / "config.json").write_text("{")
    assert _load_error(tmp_path).startswith(f"{tmp_path / 'config.json'}: not a readable JSON file")
    write_checkpoint(tmp_path, llama_config(layers=1), gptq_config(), {}, shards=1)
    (tmp_path / "model.safetensors").unlink()
    assert _load_error(tmp_path) == f"{tmp_path}: no model.safetensors nor model.safetensors.index.json"
    # the config says GPTQ, the tensors are float
    model = float_model(llama_config(layers=1))
    write_checkpoint(tmp_path, llama_config(layers=1), gptq_config(),
                     {k: v.detach() for k, v in model.state_dict().items()}, shards=1)
    assert ("quantization_config says gptq, but no layer of the checkpoint has its tensors"
            in _load_error(tmp_path))


def test_import_does_not_leak_into_opgen():
    """transformers stays out of `import opgen` and opgen.torch."""
    code = ("import sys, opgen, opgen.torch, opgen.checkpoints; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
