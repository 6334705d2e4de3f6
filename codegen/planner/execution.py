"""Execution layouts: how the kernels want a weight stored.

A user holds a weight the way its checkpoint stores it (the spec); the
kernels run on the spec's execution spec: the same logical weight (same
codes, scales and zero points: codegen/transcode.py moves it there once, at
load) stored the way the fastest kernel families of an arch read it. Where
the stored form already is that, the execution spec is the spec itself.

What each arch's kernels read is data (LAYOUTS), with its evidence in
docs/performance.md#execution-layouts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterable, Tuple

from .. import hw
from ..spec import A8_DTYPES, CONTAINER_BITS, SUB_BYTE_INT_DTYPES, Pack, Spec, Weight, weight_code
from .config import PlanError


def interleaved(P: int) -> Tuple[int, ...]:
    """The pack order whose field i and field i + P/2 hold elements 2i and
    2i + 1: each half-word shift exposes a pair of neighbours along k, which
    the magic-number decode turns into one half2 (0, 2, 4, 6, 1, 3, 5, 7 for
    eight 4-bit codes; 0, 2, ..., 14, 1, 3, ..., 15 for sixteen 2-bit ones)."""
    return tuple(range(0, P, 2)) + tuple(range(1, P, 2))


def byte_lanes(P: int) -> Tuple[int, ...]:
    """The pack order of P codes in an int32 whose field c*b + j (c = P/4 codes
    per byte b) holds element 4j + b: one shift and mask by bytes gives four
    neighbours along k, one per byte, which widen to int8 in place (0, 4, 1, 5,
    2, 6, 3, 7 for eight 4-bit codes)."""
    c = P // 4
    return tuple(4 * (i % c) + i // c for i in range(P))


@dataclass(frozen=True)
class ExecutionLayout:
    """Where one arch's kernels want the weight.

    rows_n: stored [N, K] (rows of the weight matrix, k contiguous): the row
    GEMV's coalesced walk along k and the TMA/rs GEMM's weight-row boxes.
    pack_k: sub-byte codes packed along k (each thread decodes codes of one
    row). int_words: sub-byte integer codes (1, 2 and 4 bits, ternary ones
    too) as int32 words in the interleaved order (other codes keep their
    container and order). byte_lanes: with 8-bit activations, sub-byte
    integer codes as int32 words in the byte_lanes order (the GEMM widens
    them to the 8-bit type)."""
    rows_n: bool
    pack_k: bool
    int_words: bool
    byte_lanes: bool


# Rows along n, codes packed along k, sub-byte integer codes as int32 words
# in the interleaved order: what the rs GEMM (sm_90a) reads, and the pairs
# the magic-number decode of the row GEMV and of the mma.sync GEMM take
# whole (2- and 1-bit codes stored in sequence hold each pair in
# neighbouring fields, which the rs GEMM spreads over a word's halves with
# two shifts, two masks and an or; here one shift and a lop3:
# docs/performance.md#execution-layouts).
# With 8-bit activations: their codes by byte lanes.
ROWS_K_PAIRS = ExecutionLayout(True, True, int_words=True, byte_lanes=True)
LAYOUTS = {arch: ROWS_K_PAIRS for arch in hw.ARCHS}

EXECUTION_SUFFIX = "_exec"


def _target(w: Weight, a_dtype: str, lay: ExecutionLayout) -> Weight:
    """w stored as `lay` says (the meaning kept) for activations of a_dtype."""
    s = w.scale
    code = weight_code(w)
    if (s is not None and s.granularity == "group" and s.group % (32 // code.bits)
            and not (w.pack is not None and w.pack.planes)):
        # Along k every kernel reads codes in vectors of 4+ bytes, which must
        # not straddle a scale group; a group of fewer (e.g. 44 2-bit codes,
        # or 1 int8 code) keeps the weight as stored, whose kernels may read
        # it along n.
        return w
    t = dataclasses.replace(w, layout="nt" if lay.rows_n else w.layout)
    if w.pack is None:
        return t
    if lay.byte_lanes and a_dtype in A8_DTYPES and w.dtype in SUB_BYTE_INT_DTYPES:
        pack = Pack("int32", "k", byte_lanes(32 // code.bits))
    elif lay.int_words and w.dtype in SUB_BYTE_INT_DTYPES:
        pack = Pack("int32", "k", interleaved(32 // code.bits))
    else:
        pack = dataclasses.replace(w.pack, axis="k" if lay.pack_k else w.pack.axis, planes=False)
    P = CONTAINER_BITS[pack.container] // code.bits
    if pack.axis == "k" and s is not None and s.granularity == "group" and s.group % P:
        # A word must not straddle two scale groups (validate.py's rule):
        # the stored container then, moved to k if it fits.
        pack = dataclasses.replace(w.pack, axis="k", planes=False)
        if s.group % (CONTAINER_BITS[pack.container] // code.bits):
            pack = dataclasses.replace(w.pack, planes=False)
    return dataclasses.replace(t, pack=pack)


def execution_spec(spec: Spec, arch: str) -> Spec:
    """The spec whose kernels run `spec`'s weight on `arch`: spec itself when
    it already stores it as LAYOUTS[arch] says (or not a matmul), else a spec
    named spec.name + EXECUTION_SUFFIX that differs from it only in storage.
    Every N x K the spec fits, its execution spec fits (codes move to k,
    whose alignment, K_ALIGN, holds whole words of any packing)."""
    if spec.op != "matmul" or spec.b is None:
        return spec
    lay = LAYOUTS.get(arch)
    if lay is None:
        raise PlanError(f"no execution layout for {arch} (known: {', '.join(LAYOUTS)})")
    w = _target(spec.b, spec.a.dtype, lay)
    if w == spec.b:
        return spec
    return dataclasses.replace(
        spec, name=spec.name + EXECUTION_SUFFIX, b=w,
        description=f"{spec.name} as its kernels read it on {arch} (docs/performance.md#execution-layouts)")


def held_name(spec: Spec) -> str:
    """The name of the spec the user holds: an execution spec's is its own
    less EXECUTION_SUFFIX."""
    return spec.name[:-len(EXECUTION_SUFFIX)] if spec.name.endswith(EXECUTION_SUFFIX) else spec.name


def with_execution_specs(specs: Iterable[Spec]) -> Dict[str, Spec]:
    """{name: spec} of specs and of the execution specs they run as on every
    arch (what the tuner keys their records by). Their names carry no arch:
    one that stood for two layouts would make each arch's records look
    stale to the other's, so that is an error."""
    out: Dict[str, Spec] = {}
    for spec in specs:
        out[spec.name] = spec
        for arch in sorted(LAYOUTS):
            e = execution_spec(spec, arch)
            if out.setdefault(e.name, e).content_hash() != e.content_hash():
                raise PlanError(f"{e.name}: the execution spec differs between archs")
    return out
