"""The model side of `opgen bench --e2e`: a transformers causal LM built from
its config with random weights (no download), its linear layers swapped for
a variant's and back, and greedy decoding with a static KV cache, one decode
step captured in a CUDA graph (as serving stacks run it).

torch and transformers are imported when a model is built, so importing this
module needs neither."""
from __future__ import annotations

import contextlib
import inspect
from typing import Dict, Iterator, List, Optional, Tuple

from .. import model_shapes
from ..codegen.errors import UserError

MIN_TRANSFORMERS = (5, 0)   # the static cache keeps its length on the device (graph-safe)
# The attention of models built on transformers' "sdpa": the same, except
# for a decode step's single query token (_decode_sdpa).
ATTENTION = "opgen_decode_sdpa"
# Keywords the packed path may ignore: they never change the math of one
# query token (a sliding window is in the mask). Any other one (attention
# sinks, softcap, position bias, ...) goes to transformers' own sdpa.
_PACKED_IGNORES = frozenset({"position_ids", "cache_position", "use_cache", "sliding_window",
                             "is_causal"})


def model_config(name_or_path: str, layers: Optional[int] = None) -> Tuple[dict, str]:
    """model_shapes.model_config (a shipped model or a config.json / model
    directory), with num_hidden_layers overridden by layers (a shorter model
    of the same shapes)."""
    try:
        config, source = model_shapes.model_config(name_or_path)
    except UserError as e:
        raise UserError(f"--model {e}") from None
    if layers is not None:
        if layers < 1:
            raise UserError(f"--layers {layers}: must be at least 1")
        config = dict(config, num_hidden_layers=layers)
        if isinstance(config.get("layer_types"), list):   # one entry per layer (gpt-oss, Qwen3)
            config["layer_types"] = config["layer_types"][:layers]
    return config, source


def linear_names(model) -> List[str]:
    """The qualified names of the decoder's nn.Linear layers (lm_head stays
    fp16 in every variant, as the issue's targets and serving stacks keep it)."""
    from torch import nn
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]


def build_model(config: dict, device, dtype, seed: int = 0):
    """The causal LM of `config` on `device` in `dtype`, weights drawn at
    random by the model's own initializer (seeded), in eval mode."""
    import torch
    try:
        import transformers
    except ImportError:
        raise UserError("opgen bench --e2e needs transformers (pip install transformers)") from None
    have = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    if have < MIN_TRANSFORMERS:
        raise UserError(f"opgen bench --e2e needs transformers >= "
                        f"{'.'.join(map(str, MIN_TRANSFORMERS))}, found {transformers.__version__}")
    d = {k: v for k, v in config.items() if k not in ("torch_dtype", "dtype", "architectures")}
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if model.config._attn_implementation == "sdpa":     # (models without sdpa keep theirs)
        from transformers import masking_utils
        transformers.AttentionInterface.register(ATTENTION, _decode_sdpa)
        masking_utils.AttentionMaskInterface.register(ATTENTION,
                                                      masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        model.set_attn_implementation(ATTENTION)
    return model.eval()


def _decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention with the key / value heads as the cache holds them: a
    decode step's query heads [B, H, 1, D] become their groups' query rows
    [B, H_kv, H / H_kv, D], which the cache's mask [B, 1, 1, L] broadcasts
    over. transformers' "sdpa" up to 5.17 repeats every K / V head for its
    query heads whenever a mask is given (always, with a static cache): at
    batch 64 that copied 4x the cache twice a layer, 2.2 of 3.8 ms of an
    8-layer step outside the linear layers on an H100
    (docs/performance.md#whole-model-decode). Later versions pack the same
    way. Anything else (prefill, no grouped heads, a mask per head,
    dropout, keywords beyond _PACKED_IGNORES) runs transformers' own sdpa."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    groups = getattr(module, "num_key_value_groups", 1)
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    other = [k for k, v in kwargs.items() if v is not None and k not in _PACKED_IGNORES]
    if query.shape[2] != 1 or groups == 1 or per_head_mask or dropout or other:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    b, h, _, d = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h // groups, groups, d), key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def swapped(model, modules: Dict[str, object]) -> Iterator[None]:
    """model with the named submodules replaced by `modules`, restored on exit."""
    saved = {}
    try:
        for name, mod in modules.items():
            parent, _, child = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            saved[name] = (owner, child, getattr(owner, child))
            setattr(owner, child, mod)
        yield
    finally:
        for owner, child, mod in saved.values():
            setattr(owner, child, mod)


class Decoder:
    """Greedy decoding of `model` for `batch` prompts of `prompt_len` tokens
    into a static KV cache of prompt_len + new_tokens: prefill (eager), then
    new_tokens - 1 decode steps, each reading the token in `ids`, writing the
    next token's logits (float32) into `logits` and its argmax into `ids`.
    All of a step's state lives in fixed tensors, so a step can be captured
    into a CUDA graph (`capture`) and replayed (`step`). compile: the decode
    step's forward through torch.compile (`_compiled`)."""

    def __init__(self, model, batch: int, prompt_len: int, new_tokens: int, compile: bool = False):
        import torch
        import transformers
        self.torch, self.model = torch, model
        self.batch, self.prompt_len, self.new_tokens = batch, prompt_len, new_tokens
        dev = next(model.parameters()).device
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens)
        # transformers renamed past_key_values to cache (both are accepted for a while)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(batch, model.config.vocab_size, dtype=torch.float32, device=dev)
        self.graph = None
        self.decode_forward = self._compiled() if compile else self._forward

    def _compiled(self):
        """_forward through torch.compile: Inductor, one graph (fullgraph: a
        break is an error, never a silent eager fallback), static shapes; it
        compiles on the first decode step. Dynamo's caches are reset first:
        each Decoder (another batch, other layers swapped in) compiles its
        own, and no run of them reaches Dynamo's recompile limit, past which
        it would run eagerly without a word."""
        self.torch._dynamo.reset()
        return self.torch.compile(self._forward, fullgraph=True, dynamic=False)

    def _forward(self, ids, pos):
        out = self.model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **{self.cache_kw: self.cache})
        return out.logits[:, -1]

    def prefill(self, prompt) -> None:
        """Reset the cache, run the prompt [batch, prompt_len]: the first new
        token's logits and argmax."""
        torch = self.torch
        self.cache.reset()
        pos = torch.arange(self.prompt_len, device=prompt.device).expand(self.batch, -1)
        with torch.no_grad():
            self.logits.copy_(self._forward(prompt, pos))
        self.ids.copy_(self.logits.argmax(-1, keepdim=True))
        self.pos.fill_(self.prompt_len)

    def _step(self) -> None:
        with self.torch.no_grad():
            self.logits.copy_(self.decode_forward(self.ids, self.pos))
        self.ids.copy_(self.logits.argmax(-1, keepdim=True))
        self.pos.add_(1)

    def capture(self, prompt, warmup: int = 2) -> None:
        """Capture one decode step into a CUDA graph. Warm-up steps run first
        on the capturing stream (first calls load kernels and allocate
        workspaces, neither of which may happen during capture); the
        cache is reset by the next prefill."""
        torch = self.torch
        self.prefill(prompt)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            self._step()
        torch.cuda.synchronize()
        self.graph = graph

    def step(self) -> None:
        """One decode step: the graph's replay once captured."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def run(self, prompt, force=None, each=None):
        """Prefill and decode: the model's greedy tokens [batch, new_tokens]
        (long). force [batch, new_tokens]: teacher forcing (the step of new
        token t reads force[:, t - 1], not the model's own argmax);
        each(t, logits): called with the logits of new token t (t = 0: the
        prefill's)."""
        torch = self.torch
        tokens = torch.empty(self.batch, self.new_tokens, dtype=torch.long, device=self.ids.device)
        self.prefill(prompt)
        for t in range(self.new_tokens):
            if t:
                if force is not None:
                    self.ids.copy_(force[:, t - 1:t])
                self.step()
            tokens[:, t] = self.ids[:, 0]
            if each is not None:
                each(t, self.logits)
        return tokens
