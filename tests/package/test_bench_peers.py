"""The peers of `opgen bench` (opgen/bench/peers.py), driven with torch CPU
tensors (skipped without torch)."""
import pytest

from bench_fakes import fake_gpu
from opgen.bench import peers
from opgen.bench.plan import PEERS


def test_time_peers_with_torch_cpu(monkeypatch):
    """Every peer yields a time or an error string, never an exception."""
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    out = peers.time_peers(g, list(PEERS), 256, 256, [1, 32])
    assert sorted(out) == [1, 32]
    for M, r in out.items():
        assert r["N"] == 256 and r["M"] == M
        for p in PEERS:
            assert (r.get(f"{p}_us") is not None) != (p in r["errors"]), (p, r)
        assert r["cublas_fp16_us"] == 7.5
