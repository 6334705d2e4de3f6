"""M buckets: the ranges of the token count M that share one tuned config.

The buckets follow how LLM serving calls a linear layer: M = 1 (single-token
decode), small decode batches (2-4, 5-8, ... 65-128) and prefill chunks
(129-256 ... >1024).  Powers of two bound them because kernels tile M in
powers of two, so every M in a bucket needs the same number of M tiles as
the bucket's upper end, or fewer.

`bucket_of` runs on every kernel call, so for M <= 1024 it is one tuple index.
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple

LARGE = ">1024"

# (lo, hi or None for unbounded, label), in increasing M.
BUCKETS: Tuple[Tuple[int, Optional[int], str], ...] = (
    (1, 1, "1"),
    (2, 4, "2-4"),
    (5, 8, "5-8"),
    (9, 16, "9-16"),
    (17, 32, "17-32"),
    (33, 64, "33-64"),
    (65, 128, "65-128"),
    (129, 256, "129-256"),
    (257, 512, "257-512"),
    (513, 1024, "513-1024"),
    (1025, None, LARGE),
)

LABELS: Tuple[str, ...] = tuple(label for _, _, label in BUCKETS)

# The M a bucket is tuned at: its upper end, since a config that covers the
# largest M of the range also covers the smaller ones with at most the same
# number of M tiles (and decode batches are usually padded up to it).  The
# unbounded bucket is tuned at 4096: a common prefill chunk, large enough
# that the kernel is compute-bound like every bigger M.
_REPRESENTATIVE = {label: (hi if hi is not None else 4096) for _, hi, label in BUCKETS}

_MAX_TABLE_M = 1024
# _TABLE[M] is the label of M for 1 <= M <= 1024 (index 0 is unused).
_TABLE: Tuple[Optional[str], ...] = (None,) + tuple(
    next(label for lo, hi, label in BUCKETS if lo <= m and (hi is None or m <= hi))
    for m in range(1, _MAX_TABLE_M + 1)
)


def bucket_of(M: int) -> str:
    """The label of the bucket holding M (M >= 1). On every call of an op:
    the type is checked only off the table's path (a bool would index it)."""
    if type(M) is not bool:
        try:
            if 0 < M <= _MAX_TABLE_M:
                return _TABLE[M]            # (TypeError for a float: not an index)
        except TypeError:                   # "8", None: not ordered with ints
            pass
    if isinstance(M, bool) or not isinstance(M, numbers.Integral):
        raise TypeError(f"M must be a positive int, got {M!r}")
    if M > _MAX_TABLE_M:
        return LARGE
    raise ValueError(f"M must be a positive int, got {M!r}")


def representative_M(label: str) -> int:
    """The M to tune bucket `label` at (see _REPRESENTATIVE for why)."""
    try:
        return _REPRESENTATIVE[label]
    except KeyError:
        raise ValueError(f"unknown M bucket {label!r}; known: {', '.join(LABELS)}") from None


def bucket_order(label: str) -> int:
    """Sort key putting bucket labels in increasing M (unknown labels last)."""
    try:
        return LABELS.index(label)
    except ValueError:
        return len(LABELS)
