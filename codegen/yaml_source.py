"""Reading a YAML spec document with located errors.

`parse_yaml` turns the text into plain data and records the line of every
field; `Ctx` collects the problems found, each tied to the line of its field
(or of its nearest ancestor in the file), so that all are reported together;
`Reader` reads typed fields of one mapping and reports what is wrong into
it.  What the fields mean and how they must agree is validate.py's.

The text is untrusted: the reader bounds what a file can make it do (the
limits below) and turns everything PyYAML can raise into one located line.
"""
from __future__ import annotations

import datetime
import math
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .errors import SpecError, SpecErrors

PathT = Tuple[Union[str, int], ...]

# --- limits on what a spec file can make the reader do ---------------------------
# A shipped spec is under 1 KiB, nests 5 deep (b.zero.pack.order.i) and uses
# no aliases; each limit is far above that and far below where reading slows.
MAX_SPEC_BYTES = 64 * 1024     # PyYAML's pure-Python parser reads this in < 0.5 s
MAX_DEPTH = 32                 # nesting (aliases and merges expanded): the reader
                               # recurses per level, far from Python's recursion limit
MAX_ALIAS_NODES = 1000         # nodes that aliases may add in all (each use copies its
                               # anchor's subtree: "billion laughs" grows exponentially)
MAX_NUMBER_CHARS = 100         # longer "numbers" are not converted (int() is quadratic)
INT_LIMIT = 2 ** 64            # |integer| below this: no spec field needs more, and every
                               # such int converts to a float (codebooks) without overflow

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep (allowed: at most {MAX_DEPTH})"


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
    """A field path as messages print it; a key that is not printable text
    (a newline, a control character) or that is blank or padded with spaces
    is quoted, so that a message stays one line with a visible field."""
    def part(p):
        s = str(p)
        return s if s.isprintable() and s and s.strip() == s else repr(s)
    return ".".join(part(p) for p in path) if path else "spec"


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


# --- located errors and YAML with line numbers ----------------------------------

class Ctx:
    """The problems found in one document, each located by `lines` (field
    path -> line; a path not in the file takes its nearest ancestor's line)."""

    def __init__(self, filename: str, lines: Dict[PathT, int], default_line: int = 0):
        self.file = filename
        self.lines = lines
        self.default_line = default_line
        self.errors: List[SpecError] = []
        self._seen = set()          # de-duplication in O(1) (thousands of keys are one file)

    def line(self, path: PathT) -> int:
        p = tuple(path)
        while p not in self.lines and p:
            p = p[:-1]
        return self.lines.get(p, self.default_line)

    def add(self, e: SpecError) -> None:
        if e not in self._seen:
            self._seen.add(e)
            self.errors.append(e)

    def err(self, path: PathT, message: str) -> None:
        self.add(SpecError(self.file, self.line(path), _dotted(path), message))

    def raise_if_any(self) -> None:
        if self.errors:
            errs = sorted(self.errors, key=lambda e: e.line)   # stable
            raise SpecErrors(errs)


class _Limit(Exception):
    """A limit passed while composing: args (mark, message)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader whose composer enforces MAX_DEPTH (before its own
    recursion gets deep), MAX_ALIAS_NODES, and rejects an alias used inside
    its own anchor (a cycle, which the walk below would follow forever)."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = self._nodes = self._alias_nodes = 0    # _nodes: aliases expanded
        self._size: Dict[str, int] = {}     # anchor -> expanded size of its node
        self._open = set()                  # anchors whose node is being composed

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open:
                raise _Limit(event.start_mark, f"alias *{event.anchor} is used inside its "
                                               f"own anchor &{event.anchor}, a cycle (allowed: "
                                               f"aliases of nodes written before them)")
            node = super().compose_node(parent, index)      # raises on an undefined alias
            size = self._size[event.anchor]
            self._nodes += size
            self._alias_nodes += size
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise _Limit(event.start_mark, f"aliases expand the document by more than "
                                               f"{MAX_ALIAS_NODES} nodes (allowed: at most "
                                               f"{MAX_ALIAS_NODES})")
            return node
        if isinstance(event, CollectionStartEvent) and self._depth >= MAX_DEPTH:
            raise _Limit(event.start_mark, _TOO_DEEP)
        start, anchor = self._nodes, event.anchor
        if anchor is not None:
            self._open.add(anchor)
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._nodes += 1
        if anchor is not None:
            self._open.discard(anchor)
            self._size[anchor] = self._nodes - start
        return node


# --- YAML 1.1 against YAML 1.2 ------------------------------------------------------
# PyYAML reads YAML 1.1, where plain `0200` is octal 128, `2:08` sexagesimal 128,
# `yes` true, `1_000` 1000 and `2024-01-01` a date; YAML 1.2 (editors, JSON-schema
# checkers, most other libraries) reads 200, '2:08', 'yes', '1_000' and a string,
# and reads `1e3` and `0o17` as numbers where 1.1 reads strings.  Reading either
# way would make one spec mean different things to different tools, so a plain
# value that the two versions read differently is rejected with both readings.

_CORE_12 = (   # the YAML 1.2 core schema's plain scalars (anything else is a string)
    (re.compile(r"null|Null|NULL|~|"), lambda s: None),
    (re.compile(r"true|True|TRUE"), lambda s: True),
    (re.compile(r"false|False|FALSE"), lambda s: False),
    (re.compile(r"[-+]?[0-9]+"), lambda s: int(s, 10)),
    (re.compile(r"0o[0-7]+"), lambda s: int(s[2:], 8)),
    (re.compile(r"0x[0-9a-fA-F]+"), lambda s: int(s[2:], 16)),
    (re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"), float),
    (re.compile(r"[-+]?\.(inf|Inf|INF)"), lambda s: float(s.replace(".", ""))),
    (re.compile(r"\.nan|\.NaN|\.NAN"), lambda s: math.nan),
)
_NUMBERS_12 = tuple(rx for rx, _ in _CORE_12[3:])


def _yaml12(text: str):
    for rx, conv in _CORE_12:
        if rx.fullmatch(text):
            return conv(text)
    return text


def plain_reads_as_string(text: str) -> bool:
    """Whether `text`, written as a plain (unquoted) scalar, is a string to
    YAML 1.2 too (PyYAML, which writes YAML 1.1, quotes only what 1.1 reads
    otherwise: 0E0 and 0o17 come out plain, and are numbers to 1.2)."""
    return isinstance(_yaml12(text), str)


def _same(a, b) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a)
                                              and math.isnan(b)))


def _reading(v) -> str:
    if isinstance(v, str):
        return "a string"
    if isinstance(v, datetime.date):                # datetimes too
        return f"the date {v}"
    return show(v)


def _ambiguous(text: str, v11, v12) -> str:
    plain = [show(v) for v in (v11, v12) if isinstance(v, (bool, int, float, type(None)))]
    alts = " or ".join(dict.fromkeys(plain))
    quoted = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return (f"{text} is read as {_reading(v11)} by YAML 1.1 but as {_reading(v12)} by "
            f"YAML 1.2; write it so that both agree (allowed: "
            f"{alts + ', or ' if alts else ''}the quoted string {quoted})")


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


# --- nodes -> plain data --------------------------------------------------------------

class _Converter:
    """Composed nodes -> plain data, recording each field's line in `lines`
    and every problem in ctx (a value it cannot read becomes BAD, reported:
    the caller stops before validating).  Merge keys (`<<`) are expanded: a
    mapping's own keys override merged ones, and earlier merged mappings
    override later ones (YAML's merge rule)."""

    def __init__(self, ctx: Ctx, loader: _Loader):
        self.ctx, self.lines, self.loader = ctx, ctx.lines, loader
        self.unreadable = False

    def bad(self, line: int, path: PathT, message: str) -> None:
        self.unreadable = True
        self.ctx.add(SpecError(self.ctx.file, line, _dotted(path), message))

    def value(self, node, path: PathT, depth: int):
        if depth > MAX_DEPTH:       # reachable through aliases: each part was shallow
            self.bad(node.start_mark.line + 1, path, _TOO_DEEP)
            return BAD
        if isinstance(node, MappingNode):
            return self.mapping(node, path, depth)
        if isinstance(node, SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[path + (i,)] = item.start_mark.line + 1
                items.append(self.value(item, path + (i,), depth + 1))
            return items
        return self.scalar(node, path)

    def mapping(self, node, path: PathT, depth: int) -> dict:
        out: Dict[Any, Any] = {}
        own, merged = self.pairs(node, path, depth)
        for knode, vnode, is_own in [(k, v, True) for k, v in own] + \
                                    [(k, v, False) for k, v in merged]:
            kline = knode.start_mark.line + 1
            if not isinstance(knode, ScalarNode):
                self.bad(kline, path, "a key must be a plain value, not a list or mapping")
                continue
            key = self.scalar(knode, path + (knode.value,))
            if key is BAD:
                continue
            p = path + (key,)
            if key in out:
                if is_own:
                    self.ctx.add(SpecError(self.ctx.file, kline, _dotted(p),
                                           f"duplicate key {show(key)} (first given on "
                                           f"line {self.lines[p]})"))
                continue            # a merged key that the mapping already has: overridden
            self.lines[p] = kline
            out[key] = self.value(vnode, p, depth + 1)
        return out

    def pairs(self, node, path: PathT, depth: int):
        """-> (own (key, value) node pairs, merged pairs in precedence order)."""
        own, merged = [], []
        for knode, vnode in node.value:
            if knode.tag != _MERGE_TAG:
                own.append((knode, vnode))
                continue
            sources = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
            if not all(isinstance(s, MappingNode) for s in sources):
                self.bad(knode.start_mark.line + 1, path + ("<<",),
                         "a merge key takes a mapping or a list of mappings (allowed: "
                         "<<: *anchor, <<: [*anchor1, *anchor2])")
                continue
            if depth + 1 > MAX_DEPTH:
                self.bad(knode.start_mark.line + 1, path + ("<<",), _TOO_DEEP)
                continue
            for s in sources:
                s_own, s_merged = self.pairs(s, path, depth + 1)
                merged += s_own + s_merged
        return own, merged

    def scalar(self, node: ScalarNode, path: PathT):
        text, line = node.value, node.start_mark.line + 1
        plain = node.style is None and node.tag == self.loader.resolve(
            ScalarNode, text, (True, False))
        if plain and node.tag in (_MERGE_TAG, _VALUE_TAG):
            return text             # `<<` or `=` as a value: a string (as in YAML 1.2)
        if len(text) > MAX_NUMBER_CHARS and (node.tag in _NUMBER_TAGS or (
                plain and any(rx.fullmatch(text) for rx in _NUMBERS_12))):
            self.bad(line, path, f"{_short(text)} is too long for a number (allowed: at "
                                 f"most {MAX_NUMBER_CHARS} characters)")
            return BAD
        try:
            v = self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError:
            raise
        except Exception as e:      # noqa: BLE001 -- PyYAML's constructors, given an explicit
            # tag (`!!timestamp x`, `!!float abc`), raise whatever their parsing raises
            kind = node.tag.rsplit(":", 1)[-1]
            why = f": {e}" if isinstance(e, ValueError) else ""
            self.bad(line, path, _one_line(f"{_short(text)} cannot be read as a {kind}{why} "
                                           f"(allowed: a valid {kind}, or a quoted string)"))
            return BAD
        v12 = _yaml12(text) if plain else text
        if plain and not _same(v, v12):
            self.bad(line, path, _ambiguous(text, v, v12))
            return BAD
        if is_int(v) and not -INT_LIMIT < v < INT_LIMIT:
            self.bad(line, path, f"{_short(text)} is too large (allowed: integers of "
                                 f"magnitude below 2**64)")
            return BAD
        return v


_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _line_at(text: str, pos: int) -> int:
    """The line of text[pos], counted as YAML counts (CR, NEL, LS, PS break lines)."""
    return len(_LINE_BREAK.split(text[:pos]))


def _located(filename: str, line: int, message: str) -> SpecErrors:
    return SpecErrors([SpecError(filename, line, "yaml", _one_line(message))])


def _malformed(filename: str, e: yaml.MarkedYAMLError) -> SpecErrors:
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark is not None else 1
    msg = " ".join(str(x) for x in (e.context, e.problem) if x) or "malformed YAML"
    return _located(filename, line, f"malformed YAML: {msg}")


def too_large(filename: str, size: Optional[int] = None) -> SpecErrors:
    """The error for a spec over MAX_SPEC_BYTES (size: bytes, when known)."""
    what = f"is {size} bytes" if size is not None else f"is over {MAX_SPEC_BYTES} bytes"
    return SpecErrors([SpecError(filename, 1, "spec",
                                 f"the spec {what}; too large for a spec file (allowed: at "
                                 f"most {MAX_SPEC_BYTES} bytes)")])


def decode_spec(data: bytes, filename: str) -> str:
    """A spec file's bytes -> its text: at most MAX_SPEC_BYTES of UTF-8, or
    SpecErrors naming the line of the first byte that is not UTF-8."""
    if len(data) > MAX_SPEC_BYTES:
        raise too_large(filename, len(data))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = _line_at(data[:e.start].decode("utf-8"), e.start)
        raise _located(filename, line, f"byte 0x{data[e.start]:02x} is not UTF-8 text "
                                       f"(allowed: a UTF-8 encoded file)") from None


def parse_yaml(text: str, filename: str) -> Tuple[Any, Ctx]:
    """YAML text -> (plain data, a Ctx holding the line of every field and any
    duplicate keys). Malformed, empty, oversized or unreadable text (see the
    limits above) raises SpecErrors at once."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise too_large(filename, size)
    lines: Dict[PathT, int] = {}
    ctx = Ctx(filename, lines, default_line=1)
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        if root is None:
            raise SpecErrors([SpecError(filename, 1, "spec",
                                        "empty document; expected a mapping of spec fields")])
        lines[()] = root.start_mark.line + 1
        conv = _Converter(ctx, loader)
        data = conv.value(root, (), 0)
        if conv.unreadable:         # a value the validator would only report again
            ctx.raise_if_any()
    except _Limit as e:
        mark, message = e.args
        raise _located(filename, mark.line + 1, message) from None
    except yaml.MarkedYAMLError as e:
        raise _malformed(filename, e) from None
    except yaml.reader.ReaderError as e:    # a character YAML does not allow (NUL, ...)
        line = _line_at(text, e.position)
        ch = e.character if isinstance(e.character, str) else chr(e.character)
        raise _located(filename, line, f"character #x{ord(ch):04x} is not allowed in YAML "
                                       f"text (allowed: printable characters; escape others "
                                       f"in a double-quoted string)") from None
    except yaml.YAMLError as e:
        raise _located(filename, 1, f"malformed YAML: {e}") from None
    finally:
        if loader is not None:
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
