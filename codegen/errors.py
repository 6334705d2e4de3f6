"""Errors a user can cause, and how they are reported.

`SpecError` is one problem in a spec file, tied to the line and the field
that caused it; `SpecErrors` carries all problems found in one file (the
validator reports everything it can find, not just the first).  `UserError`
is any other bad input (a command-line value, a shape that doesn't fit the
spec, ...): the CLI prints it as one line and exits with status 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List


@dataclass(frozen=True)
class SpecError:
    """One problem: `FILE:LINE: field.path: message`.

    line is 1-based; 0 means "no line" (e.g. the file does not exist).
    path is the dotted field path (e.g. `b.scale.group`, `b.pack.order.3`);
    `yaml` for a syntax error, `spec` for the document as a whole.
    """
    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.path}: {self.message}"


class SpecErrors(Exception):
    """All problems found in one spec (non-empty list of `SpecError`)."""

    def __init__(self, errors: Iterable[SpecError]):
        self.errors: List[SpecError] = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)

    def __iter__(self):
        return iter(self.errors)

    def __len__(self) -> int:
        return len(self.errors)

    @property
    def paths(self) -> List[str]:
        return [e.path for e in self.errors]


class UserError(ValueError):
    """Bad input that is not a problem inside a spec file (CLI values, sizes)."""


def shorten(text: str, limit: int = 120) -> str:
    """text for a one-line message: cut to `limit` characters, "..." last."""
    return text if len(text) <= limit else text[:limit - 3] + "..."
