"""opgen.model_shapes: the linear layers' (N, K) of real models, from their
published config.json values (written here, no download), and its errors."""
import json

import pytest

from opgen.codegen.errors import UserError
from opgen.model_shapes import (LinearShape, linear_layers, linear_shapes, model_config, read_config,
                                shipped_models)

# The fields that matter of each model's published config.json.
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LLAMA3_70B = dict(LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                  num_hidden_layers=80)
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "max_window_layers": 28,
             "use_sliding_window": False, "torch_dtype": "bfloat16"}
QWEN25_72B = dict(QWEN25_7B, hidden_size=8192, intermediate_size=29568, num_attention_heads=64,
                  num_hidden_layers=80, num_key_value_heads=8)
QWEN25_14B = dict(QWEN25_7B, hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
                  num_hidden_layers=48, num_key_value_heads=8)
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 4096}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
               "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64,
               "num_key_value_heads": 8, "num_hidden_layers": 24, "num_local_experts": 32,
               "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
               "attention_bias": True, "swiglu_limit": 7.0,
               "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                   "lm_head"]}}

# (N, K) distinct, in order: q, k/v, o (when not q's), gate/up, down
EXPECTED = {
    "llama3_8b": (LLAMA3_8B, [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]),
    "llama3_70b": (LLAMA3_70B, [(8192, 8192), (1024, 8192), (28672, 8192), (8192, 28672)]),
    "qwen2.5_7b": (QWEN25_7B, [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]),
    "qwen2.5_72b": (QWEN25_72B, [(8192, 8192), (1024, 8192), (29568, 8192), (8192, 29568)]),
    "qwen2.5_14b": (QWEN25_14B, [(5120, 5120), (1024, 5120), (13824, 5120), (5120, 13824)]),
    "mistral_7b": (MISTRAL_7B, [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]),
    # head_dim 64: q 64*64 = 4096 outputs from 2880; experts' gate_up fused (2 x 2880)
    "gpt-oss-20b": (GPT_OSS_20B, [(4096, 2880), (512, 2880), (2880, 4096), (5760, 2880),
                                  (2880, 2880)]),
}


@pytest.mark.parametrize("model", list(EXPECTED))
def test_published_models(model):
    config, shapes = EXPECTED[model]
    got = linear_shapes(config)
    assert [(s.N, s.K) for s in got] == shapes
    with_head = linear_shapes(config, lm_head=True)
    assert (with_head[-1].N, with_head[-1].K) == (config["vocab_size"], config["hidden_size"])
    assert with_head[-1].layers == ("lm_head",)


def test_layer_names():
    assert linear_shapes(LLAMA3_8B)[:2] == [
        LinearShape(4096, 4096, ("self_attn.q_proj", "self_attn.o_proj")),
        LinearShape(1024, 4096, ("self_attn.k_proj", "self_attn.v_proj"))]
    assert linear_shapes(LLAMA3_8B)[2].layers == ("mlp.gate_proj", "mlp.up_proj")
    names = [n for n, _, _ in linear_layers(GPT_OSS_20B)]
    assert names[-2:] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def test_fused_siblings_shapes():
    """fused: the wider layers replace_linear(fuse=True) runs, after the
    model's own: q + k + v (one K) and gate + up; gpt-oss's experts already
    store gate_up as one."""
    assert linear_shapes(LLAMA3_8B, fused=True)[4:] == [
        LinearShape(6144, 4096, ("self_attn.q_proj+k_proj+v_proj",)),
        LinearShape(28672, 4096, ("mlp.gate_proj+up_proj",))]
    assert linear_layers(GPT_OSS_20B, fused=True)[-1] == ("self_attn.q_proj+k_proj+v_proj", 5120, 2880)
    assert linear_shapes(LLAMA3_8B, fused=True, lm_head=True)[-1].layers == ("lm_head",)


def test_moe_with_shared_experts_and_nested_text_config():
    """Qwen2-MoE style: experts of moe_intermediate_size, a shared expert;
    a multimodal config's sizes under text_config."""
    moe = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
           "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
           "num_experts": 60, "num_attention_heads": 16, "num_key_value_heads": 16}
    got = [(n, N, K) for n, N, K in linear_layers({"text_config": moe})]
    assert ("mlp.experts.gate_proj", 1408, 2048) in got
    assert ("mlp.shared_expert.down_proj", 2048, 5632) in got
    assert not any(n.startswith("mlp.gate_proj") for n, _, _ in got)       # every layer sparse
    dense_too = dict(moe, mlp_only_layers=[0])
    assert ("mlp.gate_proj", 5632, 2048) in linear_layers(dense_too)


@pytest.mark.parametrize("change, msg", [
    ({"hidden_size": None}, "config.json: hidden_size: missing"),
    ({"num_attention_heads": "32"}, "num_attention_heads: '32' is not a positive integer"),
    ({"num_attention_heads": 30}, "num_attention_heads: 30 does not divide hidden_size 4096"),
    ({"kv_lora_rank": 512}, "kv_lora_rank: multi-head latent attention"),
])
def test_bad_configs(change, msg):
    config = {k: v for k, v in dict(LLAMA3_8B, **change).items() if v is not None}
    with pytest.raises(UserError, match=msg):
        linear_shapes(config)


def test_read_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_7B))
    for p in (tmp_path, tmp_path / "config.json"):
        config, source = read_config(p)
        assert config == MISTRAL_7B and source == str(tmp_path / "config.json")
    with pytest.raises(UserError, match="no such file"):
        read_config(tmp_path / "nothere")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="bad.json: not a readable JSON file"):
        read_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(UserError, match="expected a JSON object"):
        read_config(tmp_path / "list.json")


SHIPPED = {"llama-3-8b": "llama3_8b", "llama-3-70b": "llama3_70b", "qwen2.5-7b": "qwen2.5_7b",
           "qwen2.5-14b": "qwen2.5_14b", "qwen2.5-72b": "qwen2.5_72b", "mistral-7b": "mistral_7b",
           "gpt-oss-20b": "gpt-oss-20b"}
SIZES = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
         "num_hidden_layers", "head_dim", "num_local_experts", "vocab_size")


def test_shipped_models_have_the_published_shapes():
    """The configs shipped for `--model NAME` (no download) give each
    model's published linear shapes and sizes (the fields written above)."""
    assert shipped_models() == sorted(SHIPPED)
    for name, key in SHIPPED.items():
        config, source = model_config(name)
        want_config, shapes = EXPECTED[key]
        assert source.endswith(f"{name}.json")
        assert [(s.N, s.K) for s in linear_shapes(config)] == shapes, name
        for k in SIZES:
            assert config.get(k) == want_config.get(k), (name, k)


def test_model_config_of_a_path_or_an_unknown_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert model_config(tmp_path)[0] == LLAMA3_8B
    with pytest.raises(UserError, match="neither a shipped model"):
        model_config("llama-9")
