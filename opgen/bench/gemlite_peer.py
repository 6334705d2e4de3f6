"""gemlite (Triton kernels for W8/W4/W2/W1, MXFP4; `pip install gemlite`),
the peer of `opgen bench` (peers.py) and of `--e2e` (e2e_variants.py): its
A16W4 group-128 layer from codes, scales and zero points, in the HQQ form
W = (q - z) * s. Imported only when used: gemlite is optional.

gemlite ships tuned Triton configs per GPU (gemlite/configs/*.json) and
loads the one whose name is in the device's; a device without one (the
H200) would autotune every new shape for minutes, so there it takes the H100's
(the same sm_90 SMs)."""
from __future__ import annotations

import os
from typing import List, Optional

FALLBACK_CONFIG = "h100"     # gemlite/configs/h100.json: Hopper, as the H200
_configured = False


def gemlite():
    """The gemlite package, its configs loaded; RuntimeError saying how to
    install it when it is not."""
    global _configured
    try:
        import gemlite as gl
        from gemlite import core
    except ImportError as e:
        raise RuntimeError(f"gemlite is not installed (pip install gemlite): {e}") from None
    if not _configured:
        _configured = True
        if core.get_default_cache_config() is None:
            path = os.path.join(os.path.dirname(core.__file__), "configs", FALLBACK_CONFIG + ".json")
            if os.path.isfile(path):
                core.GemLiteLinear.load_config(path)
    return gl


def w4_layer(q, s, z, device: Optional[str] = None):
    """gemlite's A16W4 layer (fp16) of codes q (uint8 [N, K], 0-15), scales s
    and zero points z (fp16 [N, K / group])."""
    gemlite()
    from gemlite.helper import A16W4_HQQ_INT
    import torch
    return A16W4_HQQ_INT(device=str(device or q.device), dtype=torch.float16).from_weights(q, s, z)


def tensor_args(layer) -> tuple:
    """The layer's tensors, to be passed to `forward` (or copies of them)."""
    return tuple(layer.get_tensor_args())


def meta_args(layer) -> List[int]:
    return layer.get_meta_args()


def forward(x, tensors, meta: List[int]):
    """The layer's forward as a function of its tensors (gemlite.core.forward_functional)."""
    from gemlite.core import forward_functional
    return forward_functional(x, None, list(tensors), meta)
