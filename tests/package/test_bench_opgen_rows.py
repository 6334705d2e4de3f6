"""opgen's rows of `opgen bench` (opgen/bench/opgen_rows.py) on the numpy
workbench (tests/numpy_device.py): the op and the fused linear checked and
timed on the tiled problem, graph mode for the small Ms, failures recorded
in the rows."""
import types

import numpy as np
import pytest

from bench_fakes import MEAS, spec
from numpy_device import FAKE_US, NumpySession
from opgen.bench import graph, opgen_rows
from opgen.bench.report import markdown
from opgen.bench.roofline import finish_row
from opgen.codegen import numerics as nx
from opgen.codegen import planner
from opgen.codegen.transcode import transcode
from opgen.codegen.buckets import bucket_of
from opgen.codegen.reference import quantize_activation, reference_matmul_f32
from opgen.runtime import op as op_mod


class FakeOp:
    """opgen.load stand-in: the numpy reference on the numpy "device"."""

    def __init__(self, spec, N, K, wrong=False):
        self.spec, self.N, self.K, self.wrong = spec, N, K, wrong
        self.kernel_spec = planner.execution_spec(spec, "sm_90")
        self.sources = {}
        self.calls = 0

    def prepare(self, qweight, scales=None, zeros=None):
        given = {k: v for k, v in (("qweight", qweight), ("scales", scales), ("zeros", zeros))
                 if v is not None}
        return op_mod.PreparedWeight(self.kernel_spec, self.N, self.K,
                                     transcode(self.spec, self.kernel_spec, given, self.N, self.K))

    def kernel_for(self, M):
        self.sources[bucket_of(M)] = "heuristic"
        return types.SimpleNamespace(config=types.SimpleNamespace(name=f"fake_m{M}"))

    def __call__(self, a, qweight, scales=None, zeros=None, bias=None, a_scale=None, out=None):
        self.calls += 1
        tensors = {k: v for k, v in (("qweight", qweight), ("scales", scales), ("zeros", zeros))
                   if v is not None}
        ref = reference_matmul_f32(self.spec, a, tensors, a_scale=a_scale, bias=bias)
        if self.wrong:
            ref = ref * 1.5
        out[...] = nx.to_storage(np.asarray(ref, np.float32), self.spec.out.dtype)
        return out


class FakeLinear:
    """load_linear stand-in: reference quantization, then the fake op."""

    def __init__(self, op):
        self.op = op

    def __call__(self, x, qweight, scales=None, zeros=None, bias=None, out=None):
        codes, sc = quantize_activation(self.op.spec, x)
        return self.op(codes, qweight, scales, zeros, bias=bias, a_scale=sc, out=out)


def time_spec(s, N, K, Ms, logs=None, graph=False):
    return opgen_rows.time_spec(NumpySession(), s, N, K, Ms, db=None, use_db=False, verify=True,
                                graph=graph, budget_ms=1.0, seed=0, mem_cap=1 << 28,
                                log=(logs if logs is not None else []).append)


# Stored otherwise than their kernels read them (planner.execution_spec).
MOVED = ("gptq_v2_w4a16_g128", "awq_w4a16_g128", "bitnet_b158")


@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "w8a8_int8",
                                  "fp8_e4m3_w8a8", "bitnet_b158", "mxfp4"])
def test_time_spec(monkeypatch, name):
    s = spec(name)
    ops = []

    def load(sp, N, K, **kw):
        ops.append(FakeOp(sp, N, K, wrong=(name == "mxfp4")))
        return ops[-1]
    monkeypatch.setattr(op_mod, "load", load)
    monkeypatch.setattr(op_mod, "load_linear",
                        lambda sp, N, K, **kw: FakeLinear(FakeOp(sp, N, K)))
    Ms = [1, 6, 1024]                            # 1024: activations tiled along M too
    rows = time_spec(s, 512, 1024, Ms)
    assert [r["M"] for r in rows] == Ms
    for r in rows:
        assert r.get("error") is None, r
        assert r["opgen_us"] == FAKE_US and r["config"] == f"fake_m{r['M']}"
        assert r["source"] == "heuristic"
        assert r["base_shape"] == [256, 256] and r["copies"] >= 2
        if name == "mxfp4":
            assert r["verified"] is False and "error" in r["verify_msg"]
        else:
            assert r["verified"] is True and r["rel_err"] < 1e-2
        if s.a.scale == "row":                   # opgen's fused linear from fp16 activations
            assert r["opgen_linear_us"] == FAKE_US and r["linear_verified"] is True, r
        else:
            assert "opgen_linear_us" not in r and "opgen_linear_error" not in r
        # stored otherwise than its kernels read it: timed in the kernels'
        # layout (a second op), the one-time move timed as prepare_ms
        moved = name in MOVED
        assert (r.get("layout") == name + "_exec") == moved and ("prepare_ms" in r) == moved
        assert not moved or r["prepare_ms"] > 0
    timed = ops[-1] if name in MOVED else ops[0]
    assert timed.calls == len(Ms) * (1 + 3)     # one checked call + 3 timed launches, per M


def test_linear_failure_is_recorded(monkeypatch):
    monkeypatch.setattr(op_mod, "load", lambda sp, N, K, **kw: FakeOp(sp, N, K))

    def no_linear(*a, **k):
        raise RuntimeError("no quantize kernel")
    monkeypatch.setattr(op_mod, "load_linear", no_linear)
    s = spec("w8a8_int8")
    rows = time_spec(s, 256, 256, [32])
    assert rows[0]["opgen_us"] == FAKE_US and "no quantize kernel" in rows[0]["opgen_linear_error"]
    r = finish_row(dict(rows[0], bminf_w8a8_us=20.0), s, MEAS)
    assert r["linear_speedup_vs_bminf"] is None
    md = markdown({"rows": [r], "targets": []})
    assert "## Fused linear from fp16 activations" in md and "fused linear: RuntimeError" in md


def test_time_spec_setup_failure(monkeypatch):
    def load(*a, **k):
        raise RuntimeError("no kernel today")
    monkeypatch.setattr(op_mod, "load", load)
    logs = []
    rows = time_spec(spec("fp16"), 256, 256, [1, 16], logs)
    assert all(r["opgen_us"] is None and "no kernel today" in r["error"] for r in rows)
    assert "setup failed" in logs[-1]


def test_time_spec_in_graph_mode(monkeypatch):
    """graph=True: rows up to graph.MAX_M also carry the op's graph-mode
    figure (per layer), checked against the eager run, and the same for the
    op loaded with pdl=True (the session's sm_90 has PDL); larger Ms do not."""
    ops = []

    def load(sp, N, K, **kw):
        ops.append(FakeOp(sp, N, K))
        ops[-1].pdl = kw.get("pdl", False)
        return ops[-1]
    monkeypatch.setattr(op_mod, "load", load)
    logs = []
    Ms = [1, 6, 1024]
    rows = time_spec(spec("gptq_v2_w4a16_g128"), 512, 1024, Ms, logs, graph=True)
    for r in rows[:2]:
        assert r.get("error") is None and r.get("graph_error") is None, r
        L = r["graph_layers"]
        assert L >= graph.MIN_LAYERS and r["graph_bytes"] > graph.L2_FACTOR * NumpySession.l2
        assert r["opgen_graph_us"] == round(FAKE_US / L, 4) and r["graph_verified"] is True
        assert r["opgen_graph_pdl_us"] == round(FAKE_US / L, 4) and r["graph_pdl_verified"] is True
        assert r["graph_pdl_rel_err"] == 0.0 and "graph_pdl_error" not in r
        assert r["layout"] == "gptq_v2_w4a16_g128_exec"     # timed on the kernels' layout too
        assert any(f"M={r['M']}: graph of {L} layers" in line for line in logs)
        assert any(f"M={r['M']}: graph with PDL: " in line for line in logs)
    assert not any(k.startswith("graph") or k.startswith("opgen_graph") for k in rows[2])
    L = rows[0]["graph_layers"]
    # the op at the kernels' layout, then the same with pdl, on it too
    plain, with_pdl = ops[-2:]
    assert not plain.pdl and with_pdl.pdl and with_pdl.spec is plain.spec
    # per small M: one check + 3 timed launches, then L layers run eagerly, once
    # replayed for the check and 3 times by the timer (each launch), the same
    # for PDL's layers; M = 1024 isolated only
    assert plain.calls == 3 * (1 + 3) + 2 * L * (1 + 1 + 3)
    assert with_pdl.calls == 2 * L * (1 + 1 + 3)
    # without pdl (--no-pdl), or where the arch has none (sm_80): no PDL variant
    for pdl, arch in ((False, "sm_90"), (True, "sm_80")):
        session = NumpySession()
        session.arch = arch
        rows = opgen_rows.time_spec(session, spec("w4a16_sym_g128"), 512, 1024, [1], db=None,
                                    use_db=False, verify=True, graph=True, budget_ms=1.0, seed=0,
                                    mem_cap=1 << 28, log=logs.append, pdl=pdl)
        assert rows[0]["graph_verified"] is True and not any("pdl" in k for k in rows[0])
        assert not ops[-1].pdl
    r = finish_row(dict(rows[0]), spec("gptq_v2_w4a16_g128"), MEAS)
    assert r["graph_x_bytes_floor"] == round(r["opgen_graph_us"] / r["bytes_floor_us"], 4)
    assert r["graph_x_isolated"] == round(r["opgen_graph_us"] / FAKE_US, 4)
