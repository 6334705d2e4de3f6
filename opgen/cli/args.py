"""Argument types shared by the subcommands."""
from __future__ import annotations

import argparse
import math
from typing import List, Tuple


def positive_int(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number: {text!r}")
    return v


def parse_ints(text: str) -> List[int]:
    """'1,16,64' -> [1, 16, 64] (positive, duplicates dropped, order kept)."""
    try:
        vals = [int(v, 0) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return list(dict.fromkeys(vals))


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'8192x8192,4096x14336' -> [(N, K), ...] (N x K, as in the tuning DB)."""
    out = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        parts = item.lower().replace("*", "x").split("x")
        try:
            n, k = (int(p, 0) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape {item!r}: expected NxK, e.g. 8192x8192") from None
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"shape {item!r}: N and K must be positive")
        out.append((n, k))
    if not out:
        raise argparse.ArgumentTypeError(f"expected NxK[,NxK...], got {text!r}")
    return list(dict.fromkeys(out))


def parse_names(text: str) -> List[str]:
    names = [v for v in text.replace(" ", "").split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return list(dict.fromkeys(names))
