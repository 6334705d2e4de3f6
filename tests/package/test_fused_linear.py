"""opgen/fused_linear.py: sibling layers found by name, and the wide layer's
output shared by its parts (computed once an input, views for the parts)."""
import copy
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from opgen import fused_linear as fl  # noqa: E402


class Attn(nn.Module):
    def __init__(self, kv_in=32):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(32, 16, bias=False), nn.Linear(kv_in, 8, bias=False)
        self.v_proj, self.o_proj = nn.Linear(32, 8, bias=False), nn.Linear(16, 32, bias=False)


class Layer(nn.Module):
    def __init__(self, kv_in=32):
        super().__init__()
        self.self_attn = Attn(kv_in)
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = nn.Linear(32, 24), nn.Linear(32, 24)


def linear_names(model):
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def test_sibling_groups():
    """Each module's q / k / v and gate / up, all eligible and reading the
    same width; a group with a member left out, or of another width, is
    none."""
    model = nn.ModuleList([Layer(), Layer()])
    names = linear_names(model)
    assert fl.sibling_groups(model, names) == [
        ("0.self_attn.q_proj", "0.self_attn.k_proj", "0.self_attn.v_proj"), ("0.mlp.gate_proj", "0.mlp.up_proj"),
        ("1.self_attn.q_proj", "1.self_attn.k_proj", "1.self_attn.v_proj"), ("1.mlp.gate_proj", "1.mlp.up_proj")]
    without = [n for n in names if n != "1.self_attn.v_proj"]
    assert ("1.self_attn.q_proj", "1.self_attn.k_proj", "1.self_attn.v_proj") not in fl.sibling_groups(model, without)
    odd = Layer(kv_in=16)
    assert fl.sibling_groups(odd, linear_names(odd)) == [("mlp.gate_proj", "mlp.up_proj")]
    assert fl.sibling_groups(odd, linear_names(odd), groups=[("q_proj", "v_proj")]) == [
        ("self_attn.q_proj", "self_attn.v_proj")]
    # groups that overlap: a layer goes to the first group that takes it
    assert fl.sibling_groups(odd, linear_names(odd), groups=[("q_proj", "v_proj"), ("v_proj", "o_proj"),
                                                             ("gate_proj", "up_proj")]) == [
        ("self_attn.q_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")]


class Counting(nn.Module):
    """A wide layer that counts its calls."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(32, 40, bias=False), 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_parts_share_one_computation_an_input():
    wide = Counting()
    parts = fl.fused_parts(wide, [16, 8, 16])
    x = torch.randn(3, 32)
    with torch.no_grad():
        want = wide.lin(x)
        outs = [p(x) for p in parts]
        assert wide.calls == 1 and parts[0].shared._local.out is None     # served, let go
        for out, (lo, hi) in zip(outs, [(0, 16), (16, 24), (24, 40)]):
            assert torch.equal(out, want[:, lo:hi])
        assert outs[1].data_ptr() == outs[0].data_ptr() + 16 * outs[0].element_size()   # views
        # another input, or a part asked twice: computed again (slower, never stale)
        y = torch.randn(3, 32)
        assert torch.equal(parts[0](x), want[:, :16]) and torch.equal(parts[1](y), wide.lin(y)[:, 16:24])
        assert torch.equal(parts[0](y), wide.lin(y)[:, :16]) and torch.equal(parts[0](y), wide.lin(y)[:, :16])
        assert wide.calls == 4
        # an input modified in place since: computed again
        z = torch.randn(3, 32)
        parts[0](z)
        z.add_(1.0)
        assert torch.equal(parts[1](z), wide.lin(z)[:, 16:24]) and wide.calls == 6
    with torch.inference_mode():                 # (no version counter there: identity alone)
        i = torch.randn(3, 32)
        assert torch.equal(torch.cat([p(i) for p in parts], -1), wide.lin(i)) and wide.calls == 7
    # part 0 holds the wide layer: its parameters are the model's, once
    model = nn.ModuleList(parts)
    assert [n for n, _ in model.named_parameters()] == ["0.wide.lin.weight"]
    assert "part 1 of 3: columns 16:24" in repr(parts[1])


def test_a_part_dequantized_is_its_rows_of_the_wide_layer():
    """FusedPart.dequantized: the rows of the wide layer's real weight its
    output columns come from."""
    class Wide(Counting):
        def dequantized(self):
            return self.lin.weight.detach()
    wide = Wide()
    parts = fl.fused_parts(wide, [16, 8, 16])
    for p, (lo, hi) in zip(parts, [(0, 16), (16, 24), (24, 40)]):
        assert torch.equal(p.dequantized(), wide.lin.weight[lo:hi])


def test_compile_traces_one_wide_call():
    """torch.compile (Dynamo + AOTAutograd, fullgraph) keeps one call of the
    wide layer for its parts, and their outputs."""
    wide = Counting()
    parts = fl.fused_parts(wide, [16, 24])

    class Use(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = parts

        def forward(self, x):
            return torch.relu(self.a(x)).sum(-1) + self.b(x).sum(-1)

    seen = []

    def backend(gm, inputs):
        seen.append(sum(1 for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target)))
        return gm
    use = Use()
    compiled = torch.compile(use, backend=backend, fullgraph=True)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.allclose(compiled(x), use(x))
    assert seen == [1]


def test_threads_match_their_own_input():
    """The shared state is per thread: another thread calling a part with
    the same input computes its own wide output (it would otherwise take
    columns that this thread's input may replace under it), while this
    thread's next part is still served from its own. A copy of the parts
    holds no input or output."""
    wide = Counting()
    parts = fl.fused_parts(wide, [16, 24])
    x, got = torch.randn(3, 32), {}

    def other():
        with torch.no_grad():
            got["calls"], got["out"] = wide.calls, parts[1](x)
            got["after"] = wide.calls
    with torch.no_grad():
        head = parts[0](x)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert (got["calls"], got["after"]) == (1, 2) and torch.equal(got["out"], wide.lin(x)[:, 16:])
        assert torch.equal(torch.cat([head, parts[1](x)], -1), wide.lin(x)) and wide.calls == 2
        parts[0](x)
        copied = copy.deepcopy(nn.ModuleList(parts))
        assert copied[0].shared is copied[1].shared and copied[0].wide is copied[1].shared.wide
        assert getattr(copied[0].shared._local, "x", None) is None
        assert torch.equal(copied[1](x), wide.lin(x)[:, 16:])
