"""gemlite, the Triton peer (opgen/bench/gemlite_peer.py): optional, a
clear error without it; on a GPU its A16W4 layer as a function of its
tensors computes (q - z) * s."""
import importlib.util
import sys

import pytest

from opgen.bench import gemlite_peer


def test_without_gemlite_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemlite", None)
    with pytest.raises(RuntimeError, match=r"gemlite is not installed \(pip install gemlite\)"):
        gemlite_peer.gemlite()


@pytest.mark.gpu
def test_gpu_w4_layer_and_its_functional_forward():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or importlib.util.find_spec("gemlite") is None:
        pytest.skip("needs CUDA and gemlite")
    N, K = 256, 1024
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda")
    s = (torch.rand(N, K // 128, device="cuda") / 64 + 1e-3).half()
    z = torch.full((N, K // 128), 8.0, device="cuda").half()
    layer = gemlite_peer.w4_layer(q, s, z)
    x = torch.randn(5, K, device="cuda").half()
    w = (q.float() - z.float().repeat_interleave(128, 1)) * s.float().repeat_interleave(128, 1)
    want = x.float() @ w.T
    for got in (layer(x), gemlite_peer.forward(x, gemlite_peer.tensor_args(layer),
                                                gemlite_peer.meta_args(layer))):
        assert float((got.float() - want).norm() / want.norm()) < 2e-3
