"""Errors a user can cause (codegen/errors.py): one located problem prints as
`FILE:LINE: field.path: message`, a file's problems travel together, and a
bad input outside a spec is a ValueError."""
import dataclasses
import re

import pytest

from opgen.codegen.errors import SpecError, SpecErrors, UserError, shorten
from opgen.codegen.resolve import load_spec

ERR_LINE = re.compile(r"^.+:\d+: [a-z_.0-9]+: .+$")


def test_located_message_format():
    e = SpecError("specs/x.yaml", 7, "b.scale.group", "must be a positive integer")
    assert str(e) == "specs/x.yaml:7: b.scale.group: must be a positive integer"
    assert ERR_LINE.match(str(e))
    assert str(SpecError("gone.yaml", 0, "spec", "no such file")) == "gone.yaml:0: spec: no such file"
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.line = 8


def test_spec_errors_carry_every_problem():
    errs = SpecErrors(iter([SpecError("f.yaml", 2, "name", "bad"),
                            SpecError("f.yaml", 9, "b.pack.order.3", "worse")]))
    assert len(errs) == 2 and list(errs) == errs.errors
    assert errs.paths == ["name", "b.pack.order.3"]
    assert str(errs) == "f.yaml:2: name: bad\nf.yaml:9: b.pack.order.3: worse"
    assert errs.args == (str(errs),)          # what a traceback would show: every line
    with pytest.raises(SpecErrors) as ei:
        raise errs
    assert ei.value is errs


def test_a_broken_file_reports_located_lines():
    """What the validator raises prints in that format, one line per problem."""
    with pytest.raises(SpecErrors) as ei:
        load_spec("opgen: 1\nname: Bad Name\nop: conv\n", filename="mine.yaml")
    lines = str(ei.value).splitlines()
    assert len(lines) == len(ei.value) >= 2
    assert all(ERR_LINE.match(x) and x.startswith("mine.yaml:") for x in lines), lines
    assert {"name", "op"} <= set(ei.value.paths)


def test_user_error_is_a_value_error():
    assert issubclass(UserError, ValueError)
    assert not issubclass(SpecErrors, ValueError)   # the CLI tells the two apart


def test_shorten_keeps_short_text_and_cuts_long_text_to_the_limit():
    assert shorten("abc", 5) == "abc"
    assert shorten("a" * 300) == "a" * 117 + "..." and len(shorten("a" * 300)) == 120
