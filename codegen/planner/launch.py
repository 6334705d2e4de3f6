"""The typed launch plan: what render, build (plan.json) and the runtime read
of one kernel, planned once from (spec, config, arch); and the shape of a
kernel family's entry in the registry (registry.FAMILIES)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from ..lower import Layout


@dataclass(frozen=True)
class Axis:
    """One grid dimension: ceil(dim / per) blocks, rounded up to a multiple of
    `multiple` (whole clusters); or the constant `per` where dim is ""."""
    dim: str = ""           # "M" | "N" | "" (a constant)
    per: int = 1
    multiple: int = 1

    def size(self, M: int, N: int) -> int:
        if not self.dim:
            return self.per
        n = -(-{"M": M, "N": N}[self.dim] // self.per)
        return n + -n % self.multiple

    def text(self) -> str:
        if not self.dim:
            return str(self.per)
        s = self.dim if self.per == 1 else f"ceil({self.dim}/{self.per})"
        return s + (f" rounded up to a multiple of {self.multiple}" if self.multiple > 1 else "")


@dataclass(frozen=True)
class GridRule:
    """The launch grid of a kernel as a function of M and N, stated once: the
    runtime calls it, plan.json prints it."""
    x: Axis
    y: Axis = Axis()
    z: Axis = Axis()

    def __call__(self, M: int, N: int) -> Tuple[int, int, int]:
        return self.x.size(M, N), self.y.size(M, N), self.z.size(M, N)

    def text(self) -> str:
        return f"[{self.x.text()}, {self.y.text()}, {self.z.text()}]"


@dataclass(frozen=True)
class TmaBoxes:
    """The two tensor maps of a TMA launch (cuTensorMapEncodeTiled, 2-D, zero
    fill out of bounds). A: the activations [M, K], elements of elem_bytes,
    128-byte swizzle. B: the dense weights [N, K] likewise; or, where `stored`
    is set (decoded weights), the stored words of that layout as 4-byte
    elements [rows, row bytes / 4], unswizzled."""
    elem_bytes: int                 # the maps' element size (1 = UINT8, 2 = UINT16)
    box_a: Tuple[int, int]          # (rows, elements of k)
    box_b: Tuple[int, int]          # (rows, elements of B's map)
    cluster: int                    # blocks along M that share (multicast) each B tile
    stored: Optional[Layout] = None

    @property
    def b_elem_bytes(self) -> int:
        return 4 if self.stored is not None else self.elem_bytes


def staged_smem(rows: int, k_split: int, K: int) -> int:
    """Shared memory of `rows` rows of K / k_split 16-bit activations, in whole
    128-byte lines (the row GEMV stages them)."""
    return rows * -(-(K // k_split) * 2 // 128) * 128


@dataclass(frozen=True)
class Launch:
    """How one kernel is rendered and launched."""
    kind: str                       # the template to render (render.TEMPLATES' key)
    threads: int                    # per block (x)
    smem: int                       # dynamic shared memory, bytes: the most any launch takes
                                    # (what the kernel opts in to)
    target: str                     # the NVRTC target (sm_90a for wgmma kernels)
    grid: GridRule
    tma: Optional[TmaBoxes] = None  # a TMA launch's tensor maps
    staged_rows: int = 0            # the row GEMV: rows of activations staged per block,
    k_split: int = 1                # K / k_split of each (their shared memory depends on K)
    consts: Dict = field(default_factory=dict, compare=False)   # template constants (`g`)

    def smem_at(self, K: int) -> int:
        """Dynamic shared memory of one launch at K."""
        return staged_smem(self.staged_rows, self.k_split, K) if self.staged_rows else self.smem


@dataclass(frozen=True)
class Family:
    """A kernel family's entry in the registry: its rules as functions of
    (spec, config, ...). `geometry` derives the template constants or raises
    PlanError saying why the config cannot run; the others read them."""
    name: str
    geometry: Callable              # (spec, cfg, hw.Arch, Numerics, Layout) -> dict
    kind: Callable                  # (cfg, geometry) -> Launch.kind
    grid: Callable                  # (spec, cfg) -> GridRule
    shape_ok: Callable = lambda g, cfg, N, K: True       # runs at this N, K
    tma: Optional[Callable] = None  # (cfg, geometry) -> TmaBoxes or None
    staged: Optional[Callable] = None   # (cfg, geometry) -> rows of activations staged
