"""Where a spec comes from: a `Spec`, the name of a shipped spec (the
opgen.specs package), the path of a YAML file, or YAML text -> the validated
Spec.

Public API:
    as_spec(arg) -> Spec                                   the one spec resolver
    load_spec(path_or_text, filename=None) -> Spec         raises SpecErrors
    resolve_spec(arg) -> Path                              file path or shipped name
    shipped_specs() -> {name: Path}                        specs in opgen.specs
"""
from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path
from typing import Dict, Optional, Union

from .errors import SpecError, SpecErrors, shorten
from .spec import Spec
from .validate import validate_data
from .yaml_source import MAX_SPEC_BYTES, decode_spec, parse_yaml, too_large


def _read_text(path: Path, display: str) -> str:
    """The file's text; never reads more than the size limit (plus one byte to
    know it was passed), whatever the file is."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecErrors([SpecError(display, 0, "spec", "no such file")])
    except OSError as e:
        raise SpecErrors([SpecError(display, 0, "spec", f"cannot read: {e}")])
    if len(data) > MAX_SPEC_BYTES:
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        raise too_large(display, size if size and size > MAX_SPEC_BYTES else None)
    return decode_spec(data, display)


def load_spec(path_or_text: Union[str, os.PathLike], filename: Optional[str] = None) -> Spec:
    """Load and validate a spec.

    path_or_text: a path (pathlib.Path, or a one-line str naming an existing
    file or ending in .yaml/.yml), the name of a shipped spec, or YAML text.
    Raises SpecErrors listing every problem found.
    """
    if isinstance(path_or_text, os.PathLike):
        p = Path(path_or_text)
        text = _read_text(p, filename or str(p))
        return _load_text(text, filename or str(p))
    s = str(path_or_text)
    if "\n" not in s:
        p = Path(s)
        if p.is_file() or s.endswith((".yaml", ".yml")):
            return _load_text(_read_text(p, filename or s), filename or s)
        shipped = shipped_specs()
        if s in shipped:
            p = shipped[s]
            return _load_text(_read_text(p, filename or str(p)), filename or str(p))
    return _load_text(s, filename or "<string>")


def _load_text(text: str, filename: str) -> Spec:
    data, ctx = parse_yaml(text, filename)
    return validate_data(data, ctx)


def shipped_specs() -> Dict[str, Path]:
    """Shipped specs (the opgen.specs package): name -> path, sorted by name."""
    root = resources.files("opgen.specs")
    found = {}
    for entry in root.iterdir():
        if entry.name.endswith(".yaml") and entry.is_file():
            found[entry.name[: -len(".yaml")]] = Path(str(entry))
    return dict(sorted(found.items()))


def as_spec(arg: Union[Spec, str, os.PathLike]) -> Spec:
    """The spec resolver every caller uses: a Spec as it is; the name of a
    shipped spec or the path of a YAML file -> the validated Spec.  Errors
    name a file as the caller wrote it and a shipped spec by its path; a name
    that is neither says so and lists the shipped specs.  Shipped specs are
    read once per process (the package's files do not change under it)."""
    if isinstance(arg, Spec):
        return arg
    path = resolve_spec(arg)
    if Path(str(arg)).is_file():
        return load_spec(path, filename=str(arg))
    return _shipped_spec(path)


@functools.lru_cache(maxsize=None)
def _shipped_spec(path: Path) -> Spec:
    return load_spec(path)


def resolve_spec(arg: Union[str, os.PathLike]) -> Path:
    """A YAML file path, or the name of a shipped spec -> path of the file
    (the first step of as_spec)."""
    s = str(arg)
    p = Path(s)
    if "\n" in s:
        raise SpecErrors([SpecError("<YAML text>", 0, "spec", "a spec's YAML text, not a path "
                                    "or a shipped name: load_spec reads it")])
    try:
        is_file, exists = p.is_file(), p.exists()
    except OSError as e:                 # e.g. a name longer than the filesystem allows
        raise SpecErrors([SpecError(shorten(s), 0, "spec", f"cannot use this path: {e.strerror or e}")]) from None
    if is_file:
        return p
    shipped = shipped_specs()
    name = s[:-5] if s.endswith(".yaml") and os.sep not in s else s
    if name in shipped:
        return shipped[name]
    if exists:
        msg = "not a file"
    else:
        msg = "no such file and not a shipped spec name"
    raise SpecErrors([SpecError(s, 0, "spec", f"{msg} (shipped: {', '.join(shipped)})")])


__all__ = ["as_spec", "load_spec", "resolve_spec", "shipped_specs"]
