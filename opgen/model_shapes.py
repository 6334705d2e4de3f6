"""The linear layers of a Hugging Face model, read from its config.json: every
distinct weight shape (N, K) and the layers that have it, so that opgen can be
tuned for a model (`opgen tune --model`) without loading any weight.

    config, source = model_config("Meta-Llama-3-8B/")      # or .../config.json, or "llama-3-8b"
    for s in linear_shapes(config, source):                # [LinearShape(N=4096, K=4096, ...), ...]
        print(s.N, s.K, s.layers)

Covered: the attention projections (q/k/v/o from hidden_size,
num_attention_heads, num_key_value_heads, head_dim), the MLP (gate/up/down
from intermediate_size), mixture-of-experts experts (num_local_experts /
num_experts, moe_intermediate_size; gpt-oss's fused gate_up), shared experts
(shared_expert_intermediate_size) and, on request, lm_head and the wider
layers of siblings fused (FUSE_GROUPS: what `replace_linear(fuse=True)`
runs). Routers are left out (a few dozen outputs, kept in float by every
quantized format). N is the output size and K the input size, as in the
tuning DB.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Tuple, Union

from .codegen.errors import UserError, shorten

__all__ = ["LinearShape", "MODELS_DIR", "FUSE_GROUPS", "CROSS_ATTENTION", "shipped_models", "model_config",
           "read_config", "linear_layers", "linear_shapes"]

# Children of one module that read the same input, by their transformers
# names: attention's q / k / v and the gated MLP's gate / up (Llama, Mistral,
# Qwen2, Gemma, ...); opgen.fused_linear runs each group as one wider layer.
FUSE_GROUPS: Tuple[Tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Modules whose q reads another input than their k / v (cross-attention:
# BART's and Whisper's `encoder_attn`, Mllama's `cross_attn`, SeamlessM4T's
# `cross_attention`): never fused, as each input would compute the whole
# wide layer (with k / v cached, three times q's work a step).
CROSS_ATTENTION: Tuple[str, ...] = ("encoder_attn", "cross_attn", "cross_attention", "crossattention")


@dataclass(frozen=True)
class LinearShape:
    N: int                      # out_features
    K: int                      # in_features
    layers: Tuple[str, ...]     # the layers of this shape, as named in one decoder layer


# Published config.json files of common models (their fields as released),
# so that `opgen tune --model NAME` and `opgen bench --e2e --model NAME`
# need no download.
MODELS_DIR = Path(__file__).resolve().parent / "data" / "models"


def shipped_models() -> List[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def model_config(name_or_path: Union[str, Path]) -> Tuple[dict, str]:
    """(config dict, the file it came from) of a shipped model
    (`shipped_models()`) or of a config.json / model directory."""
    shipped = MODELS_DIR / f"{name_or_path}.json"
    try:
        is_shipped, exists = shipped.is_file(), Path(name_or_path).exists()
    except OSError as e:                 # e.g. a name longer than the filesystem allows
        raise UserError(f"{shorten(str(name_or_path))}: cannot use this path ({e.strerror or e})") from None
    if is_shipped:
        return read_config(shipped)
    if not exists:
        raise UserError(f"{name_or_path}: neither a shipped model ({', '.join(shipped_models())}) "
                        f"nor a config.json or model directory")
    return read_config(name_or_path)


def read_config(path: Union[str, Path]) -> Tuple[dict, str]:
    """(config dict, the file it came from) of a config.json or of a model
    directory holding one; a UserError names the file and what is wrong."""
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    return read_json_object(f, UserError, "give a Hugging Face config.json or a model directory"), str(f)


def read_json_object(f: Path, error=UserError, hint: str = "") -> dict:
    """The JSON object in file f; `error` (a UserError) names the file and
    what is wrong (hint: what to give instead of a missing file)."""
    if not f.is_file():
        raise error(f"{f}: no such file" + (f" ({hint})" if hint else ""))
    try:
        data = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{f}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{f}: expected a JSON object, got {type(data).__name__}")
    return data


def _text_config(config: Mapping, source: str) -> Tuple[Mapping, str]:
    """Multimodal configs keep the language model's sizes under text_config."""
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        return config["text_config"], "text_config."
    return config, ""


def _size(config: Mapping, key: str, source: str, prefix: str, default=None) -> int:
    v = config.get(key, default)
    if v is None:
        raise UserError(f"{source}: {prefix}{key}: missing (needed for the linear layers' shapes)")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UserError(f"{source}: {prefix}{key}: {v!r} is not a positive integer")
    return v


def linear_layers(config: Mapping, source: str = "config.json", lm_head: bool = False,
                  fused: bool = False) -> List[Tuple[str, int, int]]:
    """(name, N, K) of each linear layer of one decoder layer (experts once,
    not once per expert), then with `fused` each FUSE_GROUPS group's wider
    layer (named "prefix.q_proj+k_proj+v_proj"), then lm_head if asked."""
    config, pre = _text_config(config, source)

    def size(key, default=None):
        return _size(config, key, source, pre, default)

    if config.get("kv_lora_rank") is not None:
        raise UserError(f"{source}: {pre}kv_lora_rank: multi-head latent attention (DeepSeek) "
                        f"is not covered; give the shapes with --shapes")
    H = size("hidden_size")
    heads = size("num_attention_heads")
    kv = size("num_key_value_heads", heads)
    if H % heads and config.get("head_dim") is None:
        raise UserError(f"{source}: {pre}num_attention_heads: {heads} does not divide "
                        f"hidden_size {H} and there is no head_dim")
    hd = size("head_dim", H // heads)
    out = [("self_attn.q_proj", heads * hd, H), ("self_attn.k_proj", kv * hd, H),
           ("self_attn.v_proj", kv * hd, H), ("self_attn.o_proj", H, heads * hd)]
    experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
    if experts:
        I_e = size("moe_intermediate_size", config.get("intermediate_size"))
        if config.get("model_type") == "gpt_oss":      # gate and up fused, interleaved
            out += [("mlp.experts.gate_up_proj", 2 * I_e, H), ("mlp.experts.down_proj", H, I_e)]
        else:
            out += _mlp("mlp.experts.", I_e, H)
        if config.get("shared_expert_intermediate_size"):
            out += _mlp("mlp.shared_expert.", size("shared_expert_intermediate_size"), H)
        if config.get("mlp_only_layers") or (config.get("decoder_sparse_step") or 1) > 1:
            out += _mlp("mlp.", size("intermediate_size"), H)    # the dense layers among them
    else:
        out += _mlp("mlp.", size("intermediate_size"), H)
    if fused:
        out += _fused(out)
    if lm_head:
        out.append(("lm_head", size("vocab_size"), H))
    return out


def _mlp(prefix: str, I: int, H: int) -> List[Tuple[str, int, int]]:
    return [(prefix + "gate_proj", I, H), (prefix + "up_proj", I, H), (prefix + "down_proj", H, I)]


def _fused(layers: List[Tuple[str, int, int]]) -> List[Tuple[str, int, int]]:
    """The wider layer of each FUSE_GROUPS group among layers (its members
    children of one module, of one K): (prefix.a+b+c, the members' N summed, K)."""
    shapes = {name: (N, K) for name, N, K in layers}
    out = []
    for prefix in dict.fromkeys(name.rpartition(".")[0] for name, _, _ in layers):
        for group in FUSE_GROUPS:
            members = [f"{prefix}.{child}" if prefix else child for child in group]
            if all(m in shapes for m in members) and len({shapes[m][1] for m in members}) == 1:
                wide = f"{prefix}.{'+'.join(group)}" if prefix else "+".join(group)
                out.append((wide, sum(shapes[m][0] for m in members), shapes[members[0]][1]))
    return out


def linear_shapes(config: Mapping, source: str = "config.json", lm_head: bool = False,
                  fused: bool = False) -> List[LinearShape]:
    """The distinct (N, K) of linear_layers, in order of first appearance,
    each with the names of the layers that have it."""
    by_shape: Dict[Tuple[int, int], List[str]] = {}
    for name, N, K in linear_layers(config, source, lm_head, fused):
        by_shape.setdefault((N, K), []).append(name)
    return [LinearShape(N, K, tuple(names)) for (N, K), names in by_shape.items()]
