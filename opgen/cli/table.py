"""Plain-text tables for the terminal (`opgen tune`, `opgen db show`)."""
from __future__ import annotations

from typing import List


def format_table(headers: List[str], rows: List[List[object]]) -> str:
    """A plain-text table; numbers right-aligned."""
    cells = [[("" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)) for v in r]
             for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)
               for i in range(len(headers))]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(vals, widths, numeric)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out)
