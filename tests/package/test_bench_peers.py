"""The peers of `opgen bench` (opgen/bench/peers.py), isolated and in graph
mode, driven with torch CPU tensors (skipped without torch); on a GPU (gpu
mark), captured into CUDA graphs."""
import importlib.util
import math
import sys

import pytest

from bench_fakes import fake_gpu
from opgen.bench import peers
from opgen.bench.graph import L2_FACTOR, MIN_LAYERS
from opgen.bench.plan import PEERS
from opgen.bench.runner import Gpu


def test_time_peers_with_torch_cpu(monkeypatch):
    """Every peer yields a time or an error string, never an exception."""
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    out = peers.time_peers(g, list(PEERS), 256, 256, [1, 32], graph=False)
    assert sorted(out) == [1, 32]
    for M, r in out.items():
        assert r["N"] == 256 and r["M"] == M
        for p in PEERS:
            assert (r.get(f"{p}_us") is not None) != (p in r["errors"]), (p, r)
        assert r["cublas_fp16_us"] == 7.5


def test_peers_in_graph_mode(monkeypatch):
    """Each peer gets a per-layer figure or an error string; the rows say how
    many layers each graph held; M above graph.MAX_M has none."""
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    captured = []

    def capture(enqueue):                       # cublas_bf16 cannot be captured
        captured.append(enqueue)
        if len(captured) == 2:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        enqueue()
        return enqueue
    g.capture = capture
    out = peers.time_peers(g, ["cublas_fp16", "cublas_bf16"], 256, 256, [1, 32], graph=True)
    r = out[1]
    L = r["graph_layers"]["cublas_fp16"]
    assert L >= MIN_LAYERS and L * 256 * 256 * 2 > L2_FACTOR * g.l2
    assert r["cublas_fp16_graph_us"] == round(7.5 / L, 4) and r["cublas_fp16_us"] == 7.5
    assert r["cublas_bf16_graph_us"] is None and r["cublas_bf16_us"] == 7.5
    assert r["graph_errors"] == {"cublas_bf16": "capture: RuntimeError: CUDA error: operation "
                                                "not permitted when stream is capturing"}
    assert "graph_errors" not in out[32] and "cublas_fp16_graph_us" not in out[32]
    # without graph mode nothing is captured
    captured.clear()
    out = peers.time_peers(g, ["cublas_fp16"], 256, 256, [1], graph=False)
    assert not captured and "graph_layers" not in out[1]


def test_every_peer_in_graph_mode_with_torch_cpu(monkeypatch):
    """Every peer: a figure or an error, never an exception."""
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    r = peers.time_peers(g, list(peers.peer_defs(g, 256, 256)), 256, 256, [1], graph=True)[1]
    for p in peers.peer_defs(g, 256, 256):
        assert (r.get(f"{p}_graph_us") is not None) != (p in r["graph_errors"]), (p, r)


@pytest.mark.gpu
def test_peers_in_graph_mode_on_the_gpu(record):
    """cuBLAS, tinygemm and (when installed) gemlite captured by torch:
    finite, positive µs per layer over at least 16 layers."""
    pytest.importorskip("torch")
    g = Gpu(budget_ms=5, mem_cap=4 << 30)
    names = ["cublas_fp16", "tinygemm_int4"] + (["gemlite_w4"] if importlib.util.find_spec("gemlite") else [])
    out = g.time_peers(names, 4096, 4096, [1], graph=True)[1]
    for peer in names:
        us = out.get(f"{peer}_graph_us")
        assert us is not None and math.isfinite(us) and us > 0, out
        assert out["graph_layers"][peer] >= MIN_LAYERS
        record(check="bench graph mode", peer=peer, M=1, layers=out["graph_layers"][peer],
               graph_us=us, isolated_us=out[f"{peer}_us"])
    g.free()


def test_gemlite_without_the_package_is_an_error_string(monkeypatch):
    """gemlite is optional: without it its rows say how to install it."""
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    monkeypatch.setitem(sys.modules, "gemlite", None)
    monkeypatch.setitem(sys.modules, "gemlite.helper", None)
    r = peers.time_peers(g, ["gemlite_w4"], 256, 256, [1], graph=True)[1]
    assert r["gemlite_w4_us"] is None and r["gemlite_w4_graph_us"] is None
    assert "gemlite is not installed (pip install gemlite)" in r["errors"]["gemlite_w4"]
