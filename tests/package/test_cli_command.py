"""A subcommand (opgen/cli/command.py): frozen, and every one `opgen` is
built from states a one-line help, adds its options to its own parser and
runs to an exit status."""
import argparse
import dataclasses

import pytest

from opgen.cli import COMMANDS
from opgen.cli.command import Command


def test_command_is_frozen():
    c = Command("x", "do x", lambda p: None, lambda a: 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "y"
    assert [f.name for f in dataclasses.fields(Command)] == ["name", "help", "configure", "run"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_complete(name):
    c = COMMANDS[name]
    assert isinstance(c, Command) and c.name == name
    assert c.help and "\n" not in c.help and not c.help.endswith(".")
    assert callable(c.run)
    p = argparse.ArgumentParser(prog=f"opgen {name}")
    c.configure(p)                   # options go on the parser it is given, and parse
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--help"])
    assert e.value.code == 0
