"""op quantize (quantize.cu.j2): one block per row of activations, which it
turns into codes and one float32 scale. No Config: one launch shape."""
from __future__ import annotations

from .launch import Axis, GridRule, Launch

QUANTIZE_THREADS = 256


def quantize_plan(arch: str) -> Launch:
    return Launch(kind="quantize", threads=QUANTIZE_THREADS, smem=0, target=arch, grid=GridRule(Axis("M")))
