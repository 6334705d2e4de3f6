"""The `opgen` command table and its error handling (opgen/cli/__init__.py);
check, list and build are tested with the spec language
(tests/codegen/test_validate.py), the other subcommands next to this file."""
import pytest

from opgen import __version__, cli
from opgen.codegen.errors import UserError


def test_every_subcommand_is_in_the_table():
    assert list(cli.COMMANDS) == ["check", "list", "build", "tune", "db", "bench"]
    parser = cli.make_parser()
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([name, "--help"])
        assert e.value.code == 0


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"opgen {__version__}"


def test_errors_exit_2_without_a_traceback(monkeypatch, capsys):
    def refuse(args):
        raise UserError("no such thing")
    monkeypatch.setitem(cli.COMMANDS, "list", cli.COMMANDS["list"].__class__(
        "list", "list the shipped specs", lambda p: None, refuse))
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "opgen: error: no such thing"
