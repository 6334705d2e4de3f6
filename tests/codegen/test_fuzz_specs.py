"""The spec fuzzer (cross-cutting: the YAML reader, the validator, `opgen
check`, the planner's shape rule).

Mutates the shipped specs --
fields deleted, duplicated, retyped, swapped, shared (aliases), nested deep;
huge, negative and odd numbers; unicode; YAML 1.1 forms; truncation, random
bytes, hostile snippets; files up to 1 MB -- and runs `opgen check` on each
through the real entry point (opgen.cli.main, in process).  Properties: exit 0, or exit 2 with one located
`FILE:LINE: field: message` line per problem; never a traceback; under
CHECK_SECONDS per file; and a spec that check accepts with fixed N and K
passes build's shape rule (planner.check_shape) for them.

CI runs a bounded number of examples (under 20 s on 2 cores); a longer
session: OPGEN_FUZZ_EXAMPLES=5000 python -m pytest -s tests/codegen/test_fuzz_specs.py
(-s prints the counts of accepted and rejected files at the end).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import io
import os
import re
import sys
import time
from collections import Counter
from datetime import timedelta

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opgen.cli import main
from opgen.codegen import planner
from opgen.codegen.canonical import dump_yaml
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.yaml_source import MAX_SPEC_BYTES

CHECK_SECONDS = 2.0             # the bound on one `opgen check` of a file up to 1 MB (CPU)
LONG_RUN = int(os.environ.get("OPGEN_FUZZ_EXAMPLES", "0"))


def _settings(ci_examples: int):
    return settings(max_examples=LONG_RUN or ci_examples,
                    # wall clock, the example as a whole: a backstop far above CHECK_SECONDS
                    # (CPU time, asserted in check()) that a loaded CI machine never trips
                    deadline=timedelta(seconds=10 * CHECK_SECONDS),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


SPECS = {name: path.read_text() for name, path in shipped_specs().items()}
DATA = {name: yaml.safe_load(text) for name, text in SPECS.items()}
MATMUL = sorted(n for n, d in DATA.items() if d["op"] == "matmul")
OUTCOMES = Counter()


def _strings(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


WORDS = sorted({s for d in DATA.values() for s in _strings(d) if len(s) < 40})
NUMBERS = st.one_of(
    st.integers(-300, 5000),
    st.sampled_from([0, -1, 3, 5, 2 ** 15, 2 ** 16 + 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53 + 1,
                     2 ** 63, 2 ** 64 - 1, 2 ** 64, 2 ** 64 + 1, 10 ** 30, 10 ** 400, -(2 ** 63)]),
    st.floats(),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12), st.sampled_from(WORDS))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6),
    st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=5)), inner, max_size=4)),
    max_leaves=10)

# text that PyYAML reads but a spec reader must refuse (or read) cleanly
SNIPPETS = (
    "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)),
    "r: &r [*r]\n",
    "r: &r {x: *r}\n",
    "u: *undefined\n",
    "d: " + "[" * 3000 + "]" * 3000 + "\n",
    "d: " + "{a: " * 500 + "1" + "}" * 500 + "\n",
    "m: &m {dtype: float16}\na: {<<: *m}\n",
    "b: {<<: [*nothing]}\n",
    "b: {<<: 5}\n",
    "n: \x00\n", "n: \x07x\n", "\ufeffopgen: 1\n", "\tname: x\n",
    "---\nopgen: 1\n", "...\n", "%YAML 1.2\n---\n", "%TAG ! tag:x,2000:\n---\n",
    "n: !!python/object:os.system x\n", "n: !!binary aGk=\n", "n: !!set {a, b}\n",
    "n: !!omap [a: 1]\n", "n: !!float abc\n", "n: !!timestamp x\n", "n: !foo bar\n",
    "? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "on: 1\n", "'a\\nb': 1\n", "\"\\u2028\": 1\n",
    "n: 2001-13-45\n", "n: 0b_\n", "n: 0x_\n", "n: =\n", "<<: 1\n",
    "k: " + "9" * 5000 + "\n", "k: 1" + "0" * 400 + ".5\n", "k: .inf\n", "k: -.nan\n",
)
ODD_NUMBERS = ("0200", "2:08", "1:30.5", "0b101", "1_000", "0o17", "1e3", "yes", "Off",
               "2024-01-31", "2001-13-45", "0x_", "-0", "+7", "0x1F", "~", "9" * 120)


# --- strategies -----------------------------------------------------------------------

def _paths(node, prefix=()):
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    out = []
    for k, v in items:
        out.append(prefix + (k,))
        out += _paths(v, prefix + (k,))
    return out


def _reaches(node, target) -> bool:
    """Whether `target` (by identity) is node or inside it (shared objects
    make the data a graph: a path check alone misses an alias)."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if id(n) in seen or not isinstance(n, (dict, list)):
            continue
        seen.add(id(n))
        stack.extend(n.values() if isinstance(n, dict) else n)
    return False


def _get(d, path):
    for p in path:
        d = d[p]
    return d


def _set(d, path, value):
    _get(d, path[:-1])[path[-1]] = value


def _delete(d, path):
    parent = _get(d, path[:-1])
    if isinstance(parent, list):
        parent.pop(path[-1])
    else:
        del parent[path[-1]]


@st.composite
def mutated_data(draw, name=None):
    """A shipped spec's data with 0-4 field mutations (possibly sharing
    objects, which safe_dump writes as anchors and aliases)."""
    d = copy.deepcopy(DATA[name or draw(st.sampled_from(sorted(DATA)))])
    for _ in range(draw(st.integers(0, 4))):
        paths = _paths(d)
        if not paths:
            break
        op = draw(st.sampled_from(("delete", "retype", "swap", "share", "nest", "add", "number")))
        p = draw(st.sampled_from(paths))
        if op == "delete":
            _delete(d, p)
        elif op in ("retype", "number"):
            _set(d, p, draw(VALUES if op == "retype" else NUMBERS))
        elif op in ("swap", "share"):
            q = draw(st.sampled_from(paths))
            a, b = _get(d, p), _get(d, q)
            if _reaches(a, _get(d, q[:-1])) or (op == "swap" and _reaches(b, _get(d, p[:-1]))):
                continue                                # it would hold itself: no cycles here
            _set(d, q, a)
            if op == "swap":
                _set(d, p, b)
        elif op == "nest":
            v = _get(d, p)
            for _ in range(draw(st.integers(1, 60))):
                v = [v] if draw(st.booleans()) else {draw(st.sampled_from(WORDS)): v}
            _set(d, p, v)
        else:
            parent = _get(d, p[:-1])
            if isinstance(parent, dict):
                parent[draw(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)))] = \
                    draw(VALUES)
            else:
                parent.append(draw(VALUES))
    return d


def _dump(draw, d) -> str:
    return dump_yaml(d, sort_keys=False, allow_unicode=draw(st.booleans()),
                     default_flow_style=draw(st.sampled_from((False, None, True))),
                     width=draw(st.sampled_from((80, 10 ** 6))))


@st.composite
def mutated_files(draw):
    """Bytes of a spec file: a shipped spec as written, or its mutated data
    dumped, then 0-3 text mutations."""
    name = draw(st.sampled_from(sorted(SPECS)))
    text = SPECS[name] if draw(st.booleans()) else _dump(draw, draw(mutated_data(name)))
    data = text.encode()
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(("truncate", "bytes", "dup_line", "drop_line", "snippet",
                                   "number", "unicode")))
        lines = data.splitlines(keepends=True) or [b""]
        i = draw(st.integers(0, len(lines) - 1))
        if op == "truncate":
            data = data[:draw(st.integers(0, len(data)))]
        elif op == "bytes":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif op == "dup_line":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
            data = b"".join(lines)
        elif op == "drop_line":
            del lines[i]
            data = b"".join(lines)
        elif op == "snippet":
            lines.insert(i, draw(st.sampled_from(SNIPPETS)).encode())
            data = b"".join(lines)
        elif op == "number":
            found = list(re.finditer(rb"(?<=[ \[])[0-9]+(?=[,\]\n ])", data))
            if found:
                m = draw(st.sampled_from(found))
                data = data[:m.start()] + draw(st.sampled_from(ODD_NUMBERS)).encode() + \
                    data[m.end():]
        else:
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.text(min_size=1, max_size=6)).encode(
                "utf-8", "surrogatepass") + data[at:]
    return data


PADDING = {          # one unit of padding: what a large file is made of
    "keys": lambda i: f"k{i}: {i}\n",
    "comments": lambda i: f"# {'x' * 70}\n",
    "list": lambda i: "" if i else "extra: [" + "1, " * (MAX_SPEC_BYTES * 16) + "1]\n",
    "nested": lambda i: f"n{i}: {{a: [1, {{b: [2, 3]}}], c: *x}}\n" if i else "x: &x [1]\n",
    "string": lambda i: "" if i else "description: " + "y" * (MAX_SPEC_BYTES * 16) + "\n",
}


@st.composite
def large_files(draw):
    """A shipped spec padded to a size from a few bytes to 1 MB (around the
    size limit more often)."""
    size = draw(st.one_of(st.integers(1, 1 << 20), st.integers(MAX_SPEC_BYTES - 2000,
                                                                 MAX_SPEC_BYTES + 100)))
    unit = PADDING[draw(st.sampled_from(sorted(PADDING)))]
    text = SPECS[draw(st.sampled_from(sorted(SPECS)))]
    parts, n, i = [text], len(text), 0
    while n < size:
        u = unit(i)
        parts.append(u)
        n, i = n + len(u), i + 1
        if not u:
            break
    return "".join(parts).encode()[:size]


# --- the CLI run and its properties ----------------------------------------------------

def _run_check(path):
    """-> (exit status, stdout, stderr, CPU seconds) of `opgen check PATH`.
    CPU time: other processes on a busy machine don't count; the collector is
    paused: its passes over the test runner's own objects are not the check's."""
    out, err = io.StringIO(), io.StringIO()
    gc.disable()
    t0 = time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["check", str(path)])
    finally:
        secs = time.process_time() - t0
        gc.enable()
    return rc, out.getvalue(), err.getvalue(), secs


def _lines(data: bytes) -> int:
    """Lines as YAML counts them (CR, NEL, LS and PS break lines too); a byte
    that is not UTF-8 breaks no line (the error naming it counts the same way)."""
    return len(re.split("\r\n|[\r\n\x85\u2028\u2029]", data.decode("utf-8", "replace")))


def check(path):
    """`opgen check PATH` in process: the properties every file must have;
    -> (exit status, stderr)."""
    rc, out, err, secs = _run_check(path)
    assert "Traceback" not in out + err
    assert rc in (0, 2), f"exit {rc}: {err}"
    if secs >= CHECK_SECONDS:       # slow twice, or a pause of the machine's (page faults)
        secs = min(secs, _run_check(path)[3])
    assert secs < CHECK_SECONDS, f"{secs:.2f} s"
    if rc == 0:
        assert re.fullmatch(rf"{re.escape(str(path))}: ok \([a-z0-9_]+\)\n", out) and not err
        OUTCOMES["accepted"] += 1
        return rc, err
    lines = err.split("\n")
    assert lines[-1] == "" and lines[:-1], repr(err)
    n_lines = _lines(path.read_bytes())
    for line in lines[:-1]:
        m = re.fullmatch(rf"{re.escape(str(path))}:(\d+): (\S[^\n]*?): (\S.*)", line)
        assert m, f"not one located line: {line!r}"
        assert 1 <= int(m.group(1)) <= n_lines, line
    OUTCOMES["rejected"] += 1
    return rc, err


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    yield path
    if LONG_RUN:
        print(f"\nfuzz counts: {sum(OUTCOMES.values())} files, {OUTCOMES['accepted']} accepted, "
              f"{OUTCOMES['rejected']} rejected with located lines", file=sys.__stderr__)


@_settings(ci_examples=1000)
@given(data=mutated_files())
@example(data=b"name: a\rop: \x80\n")      # CR breaks a line before the bad byte (line 2 of 2)
def test_mutated_specs_are_accepted_or_rejected_cleanly(spec_file, data):
    spec_file.write_bytes(data)
    check(spec_file)


@_settings(ci_examples=60)
@given(data=large_files())
def test_large_files_are_answered_quickly(spec_file, data):
    spec_file.write_bytes(data)
    check(spec_file)


SIZES = st.one_of(st.integers(1, 9000), st.integers(1, 1200).map(lambda x: 8 * x),
                  st.integers(1, 100).map(lambda x: 128 * x),
                  st.sampled_from((3, 5, 4104, 2 ** 31, 2 ** 32 + 128, 2 ** 64 + 1)))


@_settings(ci_examples=400)
@given(name=st.sampled_from(MATMUL), N=SIZES, K=SIZES)
@example(name="fp8_e4m3_w8a16", N=3, K=5)                 # both once passed check, not build
@example(name="awq_w4a16_g128", N=4104, K=4096)
def test_what_check_accepts_build_accepts(spec_file, name, N, K):
    d = copy.deepcopy(DATA[name])
    d["shape"] = {"M": "dynamic", "N": N, "K": K}
    spec_file.write_text(yaml.safe_dump(d, sort_keys=False))
    if check(spec_file)[0] == 0:
        planner.check_shape(load_spec(spec_file), N, K)


# --- the files that hung or crashed `opgen check` (issue 25, items 5-7) --------------------

SHAPE = "shape: {M: dynamic, N: any, K: any}"
HOSTILE = {         # what: (file text, what its error line says)
    "billion laughs": (SNIPPETS[0], "aliases expand the document"),
    "recursive alias": ("opgen: 1\nname: &a [*a]\n", "a cycle"),
    "deep nesting": ("opgen: 1\nname: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
    "5000 unknown keys": ("opgen: 1\n" + "".join(f"k{i}: 1\n" for i in range(5000)),
                          "unknown key 'k4999'"),
    "5 MB of keys": ("k: 1\n" * (1 << 20), "too large for a spec file"),
    "400-digit codebook entry": (SPECS["bitnet_b158"].replace(
        "dtype: ternary", "dtype: codebook\n  bits: 1\n  codebook: [0, " + "9" * 400 + "]"),
        "too long for a number"),
    "NUL byte": (SPECS["fp16"].replace("fp16", "fp\x0016", 1), "#x0000 is not allowed"),
    "invalid date": (SPECS["fp16"].replace("name: fp16", "name: 2001-13-45"),
                     "cannot be read as a timestamp"),
    "octal": (SPECS["fp16"].replace(SHAPE, "shape: {M: dynamic, N: 0200, K: any}"),
              "0200 is read as 128 by YAML 1.1 but as 200 by YAML 1.2"),
    "sexagesimal": (SPECS["fp16"].replace(SHAPE, "shape: {M: dynamic, N: 2:08, K: any}"),
                    "2:08 is read as 128 by YAML 1.1 but as a string"),
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_hostile_files_are_rejected_with_located_lines(spec_file, what):
    text, says = HOSTILE[what]
    assert text not in SPECS.values()
    spec_file.write_text(text)
    rc, err = check(spec_file)
    assert rc == 2 and says in err


def test_merge_keys_are_read(spec_file):
    text, order = SPECS["gptq_v2_w4a16_g128"], "order: [0, 1, 2, 3, 4, 5, 6, 7]}"
    k = f"pack: {{container: int32, axis: k, {order}"
    n = f"pack: {{container: int32, axis: n, {order}"
    assert k in text and n in text
    text = text.replace(k, "pack: &pk" + k[len("pack:"):])
    spec_file.write_text(text.replace(n, "pack: {<<: *pk, axis: n}"))
    assert check(spec_file) == (0, "")
    assert load_spec(spec_file) == load_spec("gptq_v2_w4a16_g128")
