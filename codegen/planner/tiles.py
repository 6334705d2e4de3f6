"""What several kernel families share: the decoded weight tile (stored words
-> a swizzled compute tile, vector by vector: the cp.async GEMM, the TMA GEMM
and the dequant kernel), and the shared-memory reserve."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..lower import Layout, Numerics, Vector, vector
from .config import PlanError

# Static shared memory (codebook, split-K flag) shares the opt-in limit with
# the dynamic part: this much is kept for it.
STATIC_SMEM_RESERVE = 1024


def vector_bytes(lay: Layout, rowb: int, group: int, k_extent_max: int) -> Optional[int]:
    """The widest weight vector that fits the tile row and one scale group,
    preferring those spanning at most 8 columns n (each needs its own scale and
    zero in registers)."""
    fits = []
    for vb in (16, 8, 4):
        if rowb % vb or vb % lay.elem_bytes:
            continue
        v = vector(lay, vb)
        if v.k_extent > k_extent_max or (group and group % v.k_extent):
            continue
        fits.append((v.n_extent > 8, vb))
    return min(fits, key=lambda f: (f[0], -f[1]))[1] if fits else None


def k_major(lay: Layout) -> bool:
    """Whether the weight tile the MMA reads is K-major: codes packed along k,
    or unpacked weights stored [N, K]."""
    return lay.pack_axis == "k" or (lay.pack_axis is None and lay.row_axis == "n")


def decoded_tile(lay: Layout, num: Numerics, BN: int, BK: int, kmajor: bool, ce: int = 2) -> Dict:
    """A BN x BK tile of stored weight words (b_rows x b_rowb bytes, copied in
    b_chunk pieces) and the swizzled compute tile of ce-byte elements it
    decodes into (bs_rows x bs_rowb bytes; K-major: BN rows of BK elements),
    vector by vector. Widened codes (num.widen) store whole words of the
    compute tile, not `stores`."""
    extent = {"n": BN, "k": BK}
    rows = extent[lay.row_axis] // lay.row_div
    rowb = extent[lay.col_axis] // lay.col_div * lay.elem_bytes
    if extent[lay.row_axis] % lay.row_div or extent[lay.col_axis] % lay.col_div or rowb < 4:
        raise PlanError("tile does not hold whole weight words")
    chunk = next((c for c in (16, 8, 4) if rowb % c == 0), None)
    group = num.group
    vb = vector_bytes(lay, rowb, group, BK)
    if vb is None:
        raise PlanError(f"no 4/8/16-byte weight vector lies inside one scale group of {group} "
                        f"and one {BN}x{BK} tile" if group else
                        f"no 4/8/16-byte weight vector fits one {BN}x{BK} tile")
    vec = vector(lay, vb)
    bs_rows, bs_rowb = (BN, BK * ce) if kmajor else (BK, BN * ce)
    if bs_rowb % 128:
        raise PlanError("decoded tile rows must be a multiple of 128 bytes")
    return dict(b_kmajor=kmajor, b_rows=rows, b_rowb=rowb, b_chunk=chunk,
                bs_rows=bs_rows, bs_rowb=bs_rowb, vec=vec,
                stores=[] if num.widen else stores(vec, kmajor))


def stores(vec: Vector, kmajor: bool) -> List[dict]:
    """Group a vector's elements into contiguous runs along the decoded tile's
    inner axis, cut into aligned 16/8/4/2-byte shared-memory stores."""
    lines: Dict[int, List[Tuple[int, int]]] = {}
    for e, (dn, dk) in enumerate(zip(vec.dn, vec.dk)):
        line, inner = (dn, dk) if kmajor else (dk, dn)
        lines.setdefault(line, []).append((inner, e))
    out = []
    vt = {8: "uint4", 4: "uint2", 2: "uint32_t", 1: "unsigned short"}
    for line, items in sorted(lines.items()):
        items.sort()
        inners = [i for i, _ in items]
        assert inners == list(range(inners[0], inners[0] + len(inners))), "non-contiguous run"
        pos = 0
        while pos < len(items):
            cnt = 8
            while cnt > 1 and (pos + cnt > len(items) or (items[pos][0] % cnt)):
                cnt //= 2
            out.append(dict(line=line, inner=items[pos][0], count=cnt, vec_t=vt[cnt],
                            elems=[e for _, e in items[pos:pos + cnt]]))
            pos += cnt
    return out
