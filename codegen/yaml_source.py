"""Reading a YAML spec document with located errors.

`parse_yaml` turns the text into plain data and records the line of every
field; `Ctx` collects the problems found, each tied to the line of its field
(or of its nearest ancestor in the file), so that all are reported together;
`Reader` reads typed fields of one mapping and reports what is wrong into
it.  What the fields mean and how they must agree is validate.py's.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .errors import SpecError, SpecErrors

PathT = Tuple[Union[str, int], ...]


class _Bad:
    """Marker for a field that is present but invalid (already reported)."""

    def __repr__(self) -> str:
        return "<invalid>"


BAD = _Bad()


def ok(*vals) -> bool:
    return all(v is not BAD for v in vals)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def show(v) -> str:
    """A value as an error message quotes it (YAML spelling, no dumps)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return str(v)


def allowed_values(vals) -> str:
    """The "(allowed: ...)" tail of a message that lists the choices."""
    return "(allowed: " + ", ".join(str(v) for v in vals) + ")"


def _dotted(path: PathT) -> str:
    return ".".join(str(p) for p in path) if path else "spec"


# --- located errors and YAML with line numbers ----------------------------------

class Ctx:
    """The problems found in one document, each located by `lines` (field
    path -> line; a path not in the file takes its nearest ancestor's line)."""

    def __init__(self, filename: str, lines: Dict[PathT, int], default_line: int = 0):
        self.file = filename
        self.lines = lines
        self.default_line = default_line
        self.errors: List[SpecError] = []

    def line(self, path: PathT) -> int:
        p = tuple(path)
        while p not in self.lines and p:
            p = p[:-1]
        return self.lines.get(p, self.default_line)

    def err(self, path: PathT, message: str) -> None:
        e = SpecError(self.file, self.line(path), _dotted(path), message)
        if e not in self.errors:
            self.errors.append(e)

    def raise_if_any(self) -> None:
        if self.errors:
            errs = sorted(self.errors, key=lambda e: e.line)   # stable
            raise SpecErrors(errs)


def _node_to_py(node, path: PathT, lines: Dict[PathT, int], ctx: Ctx, loader):
    if isinstance(node, MappingNode):
        out: Dict[Any, Any] = {}
        for knode, vnode in node.value:
            if isinstance(knode, ScalarNode):
                key = loader.construct_object(knode, deep=True)
            else:
                key = "<complex key>"
            try:
                hash(key)
            except TypeError:  # pragma: no cover - scalars are hashable
                key = str(key)
            p = path + (key,)
            kline = knode.start_mark.line + 1
            if key in out:
                ctx.errors.append(SpecError(ctx.file, kline, _dotted(p),
                                            f"duplicate key {show(key)} (first given on "
                                            f"line {lines[p]})"))
                continue
            lines[p] = kline
            out[key] = _node_to_py(vnode, p, lines, ctx, loader)
        return out
    if isinstance(node, SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            items.append(_node_to_py(item, path + (i,), lines, ctx, loader))
        return items
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, filename: str) -> Tuple[Any, Ctx]:
    """YAML text -> (plain data, a Ctx holding the line of every field and any
    duplicate keys). Malformed or empty text raises SpecErrors at once."""
    lines: Dict[PathT, int] = {}
    ctx = Ctx(filename, lines, default_line=1)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        msg = " ".join(str(x) for x in (e.context, e.problem) if x) or "malformed YAML"
        raise SpecErrors([SpecError(filename, line, "yaml", f"malformed YAML: {msg}")])
    except yaml.YAMLError as e:
        raise SpecErrors([SpecError(filename, 1, "yaml", f"malformed YAML: {e}")])
    if root is None:
        raise SpecErrors([SpecError(filename, 1, "spec",
                                    "empty document; expected a mapping of spec fields")])
    lines[()] = root.start_mark.line + 1
    loader = yaml.SafeLoader("")
    try:
        data = _node_to_py(root, (), lines, ctx, loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise SpecErrors([SpecError(filename, line, "yaml", f"malformed YAML: {e.problem}")])
    finally:
        loader.dispose()
    return data, ctx


# --- field readers --------------------------------------------------------------

class Reader:
    """Reads fields of one mapping, reporting problems into ctx.

    Each getter returns the value, the default when absent, or BAD when the
    field is present but wrong (already reported)."""

    def __init__(self, ctx: Ctx, m: Optional[dict], path: PathT):
        self.ctx, self.m, self.path = ctx, m, path

    @classmethod
    def mapping(cls, ctx: Ctx, value, path: PathT, keys: Tuple[str, ...],
                required: Tuple[str, ...] = ()) -> Optional["Reader"]:
        if not isinstance(value, dict):
            ctx.err(path, f"must be a mapping with keys {', '.join(keys)}; got {show(value)}")
            return None
        for k in value:
            if k not in keys:
                ctx.err(path + (k,), f"unknown key {show(k)} {allowed_values(keys)}")
        for k in required:
            if k not in value:
                ctx.err(path + (k,), "required field missing")
        return cls(ctx, value, path)

    def has(self, key: str) -> bool:
        return key in self.m

    def p(self, key: str) -> PathT:
        return self.path + (key,)

    def raw(self, key: str, default=None):
        return self.m.get(key, default)

    def choice(self, key: str, allowed, default=None, what: str = "value"):
        if key not in self.m:
            return default
        v = self.m[key]
        if not isinstance(v, str) or v not in allowed:
            self.ctx.err(self.p(key), f"{show(v)} is not a valid {what} {allowed_values(allowed)}")
            return BAD
        return v

    def pos_int_or_word(self, key: str, words, default=None, what: str = "size"):
        if key not in self.m:
            return default
        v = self.m[key]
        if (is_int(v) and v > 0) or (isinstance(v, str) and v in words):
            return v
        self.ctx.err(self.p(key), f"{show(v)} is not a valid {what} "
                                  f"(allowed: a positive integer, {', '.join(words)})")
        return BAD

    def integer(self, key: str, default=None, lo=None, hi=None):
        if key not in self.m:
            return default
        v = self.m[key]
        if not is_int(v):
            self.ctx.err(self.p(key), f"must be an integer; got {show(v)}")
            return BAD
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            self.ctx.err(self.p(key), f"{v} is out of range (allowed: {rng})")
            return BAD
        return v

    def boolean(self, key: str, default=False):
        if key not in self.m:
            return default
        v = self.m[key]
        if not isinstance(v, bool):
            self.ctx.err(self.p(key), f"must be true or false; got {show(v)}")
            return BAD
        return v

    def string(self, key: str, default=None):
        if key not in self.m:
            return default
        v = self.m[key]
        if not isinstance(v, str):
            self.ctx.err(self.p(key), f"must be a string; got {show(v)}")
            return BAD
        return v
