"""The model side of `opgen bench --e2e` (opgen/bench/e2e_model.py): configs
(shipped and given), the model built from one, swapping layers in and out,
and greedy decoding with a static KV cache, checked against the model run
on the whole sequence without a cache. A decode step must never wait on the
host (no scalar read-back): that is what lets it be captured into a CUDA
graph, checked here on the CPU by the ops a step dispatches."""
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from opgen.bench import e2e_model as em  # noqa: E402
from opgen.codegen.errors import UserError  # noqa: E402
from opgen.model_shapes import linear_shapes  # noqa: E402
from tiny_llama import TINY  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")


@pytest.fixture(scope="module")
def tiny():
    return em.build_model(TINY, "cpu", torch.float16, seed=0)


def test_the_shipped_llama_3_8b_config_has_its_published_shapes():
    config, source = em.model_config("llama-3-8b")
    assert source.endswith("llama-3-8b.json")
    assert [(s.N, s.K) for s in linear_shapes(config)] == [
        (4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
    assert config["num_hidden_layers"] == 32 and config["vocab_size"] == 128256
    assert em.model_config("llama-3-8b", layers=2)[0]["num_hidden_layers"] == 2
    # a per-layer list follows the shorter model
    short = em.model_config("gpt-oss-20b", layers=3)[0]
    assert short["num_hidden_layers"] == 3 and len(short["layer_types"]) == 3


def test_a_config_file_or_directory_and_clear_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert em.model_config(str(tmp_path))[0]["hidden_size"] == 256
    assert em.model_config(str(tmp_path / "config.json"))[0]["hidden_size"] == 256
    with pytest.raises(UserError, match="neither a shipped model"):
        em.model_config("no-such-model")
    with pytest.raises(UserError, match="at least 1"):
        em.model_config("llama-3-8b", layers=0)


def test_linear_names_are_the_decoders_without_lm_head(tiny):
    names = em.linear_names(tiny)
    assert len(names) == 7 * TINY["num_hidden_layers"] and "lm_head" not in names
    assert next(tiny.parameters()).dtype == torch.float16


def test_swapped_restores_the_layers_even_on_an_error(tiny):
    name = em.linear_names(tiny)[0]
    before = tiny.get_submodule(name)
    with pytest.raises(RuntimeError):
        with em.swapped(tiny, {name: torch.nn.Identity()}):
            assert isinstance(tiny.get_submodule(name), torch.nn.Identity)
            raise RuntimeError("x")
    assert tiny.get_submodule(name) is before


def test_greedy_decoding_equals_the_uncached_model(tiny):
    """Tokens from the static cache, step by step, are the argmax of the
    model run once on the whole sequence; teacher forcing with those tokens
    gives them again."""
    prompt = torch.randint(0, TINY["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(0))
    dec = em.Decoder(tiny, 3, 9, 6)
    logits = []
    tokens = dec.run(prompt, each=lambda t, lg: logits.append(lg.clone()))
    assert tokens.shape == (3, 6) and len(logits) == 6
    with torch.no_grad():
        full = tiny(input_ids=torch.cat([prompt, tokens], 1)).logits.float()
    assert torch.equal(full[:, 8:-1].argmax(-1), tokens)
    for t, lg in enumerate(logits):
        assert torch.allclose(lg, full[:, 8 + t], atol=1e-2, rtol=1e-2)
    assert torch.equal(dec.run(prompt, force=tokens), tokens)
    # a forced token that is not the argmax changes what follows
    forced = tokens.clone()
    forced[:, 0] = (tokens[:, 0] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        full2 = tiny(input_ids=torch.cat([prompt, forced[:, :1]], 1)).logits.float()
    seen = []
    dec.run(prompt, force=forced, each=lambda t, lg: seen.append(lg.clone()))
    assert torch.allclose(seen[1], full2[:, -1], atol=1e-2, rtol=1e-2)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_a_decode_step_never_reads_a_scalar_back():
    """aten._local_scalar_dense (.item(), bool(tensor)) would make a step wait
    on the host, which a CUDA graph capture refuses."""
    model = em.build_model(TINY, "cpu", torch.float16, seed=1)
    dec = em.Decoder(model, 2, 5, 4)
    dec.prefill(torch.randint(0, TINY["vocab_size"], (2, 5)))
    with _Ops() as spy:
        dec.step()
    assert spy.ops and not {o for o in spy.ops if "local_scalar" in o or "nonzero" in o}


def test_a_compiled_decode_step_is_one_graph_and_computes_as_the_eager_one():
    """compile: the decode step through torch.compile (Inductor; fullgraph,
    so a break would be an error), opgen's custom ops inside (W8A8: its
    activation quantizer and its matmul). Teacher-forced on the eager
    tokens, the same logits up to Inductor's fp32 intermediates (its fused
    norms skip fp16 roundings, which the int8 activations then amplify)."""
    from opgen.bench.e2e_variants import variant
    model = em.build_model(TINY, "cpu", torch.float16, seed=3)
    v = variant("opgen:w8a8_int8")
    mods = {n: v.layer(model.get_submodule(n))[0] for n in em.linear_names(model)}
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    eager, compiled = [], []
    with em.swapped(model, mods):
        tokens = em.Decoder(model, 2, 5, 4).run(prompt, each=lambda t, lg: eager.append(lg.clone()))
        torch._dynamo.utils.counters.clear()
        em.Decoder(model, 2, 5, 4, compile=True).run(prompt, force=tokens,
                                                     each=lambda t, lg: compiled.append(lg.clone()))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    want, got = torch.stack(eager), torch.stack(compiled)
    assert torch.equal(got[0], want[0])                     # the prefill: eager in both
    assert float((got - want).abs().max() / want.abs().max()) < 5e-2


@pytest.mark.gpu
@cuda
def test_gpu_the_captured_step_decodes_as_the_eager_one():
    model = em.build_model(TINY, "cuda", torch.float16, seed=2)
    prompt = torch.randint(0, TINY["vocab_size"], (4, 7), device="cuda")
    eager = em.Decoder(model, 4, 7, 8).run(prompt)
    dec = em.Decoder(model, 4, 7, 8)
    dec.capture(prompt)
    assert dec.graph is not None
    assert torch.equal(dec.run(prompt), eager)
    assert torch.equal(dec.run(prompt), eager)       # a replay again from a reset cache


def test_a_decode_step_attends_with_the_cached_kv_heads_as_transformers_sdpa_does(monkeypatch):
    """The model's attention (ATTENTION) runs its own packed path in a
    decode step, never repeating K / V heads (transformers' repeat_kv would
    copy the cache per query head), and gives transformers' "sdpa" logits
    (fp32: equal to rounding)."""
    import transformers.integrations.sdpa_attention as sa
    model = em.build_model(TINY, "cpu", torch.float32, seed=4)
    assert model.config._attn_implementation == em.ATTENTION
    assert TINY["num_attention_heads"] > TINY["num_key_value_heads"]
    prompt = torch.randint(0, TINY["vocab_size"], (3, 6), generator=torch.Generator().manual_seed(4))
    dec = em.Decoder(model, 3, 6, 5)
    dec.prefill(prompt)
    want, tokens = [dec.logits.clone()], [dec.ids.clone()]

    def refuse(*a, **k):
        raise AssertionError("a decode step ran transformers' sdpa or repeated K / V heads")
    with monkeypatch.context() as m:
        m.setattr(sa, "repeat_kv", refuse)
        m.setattr(sa, "sdpa_attention_forward", refuse)
        for _ in range(4):
            dec.step()
            want.append(dec.logits.clone())
            tokens.append(dec.ids.clone())
    model.set_attn_implementation("sdpa")
    try:
        got = []
        em.Decoder(model, 3, 6, 5).run(prompt, force=torch.cat(tokens, 1),
                                       each=lambda t, lg: got.append(lg.clone()))
    finally:
        model.set_attn_implementation(em.ATTENTION)
    assert torch.allclose(torch.stack(got), torch.stack(want), atol=1e-5, rtol=1e-5)


def test_models_without_sdpa_keep_their_attention_and_other_keywords_take_transformers_sdpa(monkeypatch):
    """gpt-oss (attention sinks, no sdpa) builds with its own attention;
    a keyword the packed path does not know (its sinks: s_aux) sends even a
    decode step to transformers' sdpa."""
    import transformers.integrations.sdpa_attention as sa
    config, _ = em.model_config("gpt-oss-20b", layers=1)
    model = em.build_model(config, "meta", torch.float16)
    assert model.config._attn_implementation not in (em.ATTENTION, "sdpa")
    calls = []
    monkeypatch.setattr(sa, "sdpa_attention_forward", lambda *a, **k: calls.append(k) or "stock")
    module = torch.nn.Module()
    module.num_key_value_groups = 2
    q, kv = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8)
    assert em._decode_sdpa(module, q, kv, kv, None, s_aux=torch.zeros(4)) == "stock"
    assert em._decode_sdpa(module, q, kv, kv, None, sliding_window=4)[0].shape == (1, 1, 4, 8)
    assert len(calls) == 1
