"""How `opgen bench` records a failure in a row or the log: the exception's
type and first line, cut short (a row never carries a traceback)."""
from __future__ import annotations


def short_error(e: BaseException, n: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first[:n]
