"""The `opgen` command table and its error handling (opgen/cli/__init__.py);
each subcommand is tested in test_cli_<module>.py."""
import pytest

from opgen import __version__, cli
from opgen.cli import COMMANDS, bench, build, db, main, specs, tune
from opgen.codegen.errors import SpecError, SpecErrors, UserError


def test_every_subcommand_is_in_the_table():
    assert list(cli.COMMANDS) == ["check", "list", "schema", "build", "tune", "db", "bench"]
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


def test_cli_table_has_commands():
    assert {"check", "list", "build"} <= set(COMMANDS)
    with pytest.raises(SystemExit) as ei:
        main(["frobnicate"])
    assert ei.value.code == 2


def test_no_command_is_shadowed():
    """The table is built from each module's COMMANDS: two commands of one
    name would leave only the last."""
    listed = [c.name for m in (specs, build, tune, db, bench) for c in m.COMMANDS]
    assert sorted(listed) == sorted(COMMANDS)


def _failing(monkeypatch, exc):
    def run(args):
        raise exc
    monkeypatch.setitem(cli.COMMANDS, "list", cli.COMMANDS["list"].__class__(
        "list", "list the shipped specs", lambda p: None, run))


def test_spec_errors_are_one_line_each(monkeypatch, capsys):
    _failing(monkeypatch, SpecErrors([SpecError("a.yaml", 3, "b.dtype", "bad"),
                                      SpecError("a.yaml", 5, "out", "worse")]))
    assert main(["list"]) == 2
    assert capsys.readouterr().err.splitlines() == ["a.yaml:3: b.dtype: bad", "a.yaml:5: out: worse"]


@pytest.mark.parametrize("exc", [RuntimeError("nvrtc failed"), OSError("unreadable")])
def test_runtime_and_os_errors_exit_1(monkeypatch, capsys, exc):
    _failing(monkeypatch, exc)
    assert main(["list"]) == 1
    assert capsys.readouterr().err.strip() == f"opgen: error: {exc}"


def test_a_closed_pipe_is_not_an_error(monkeypatch, capsys):
    _failing(monkeypatch, BrokenPipeError())
    assert main(["list"]) == 0
    assert capsys.readouterr().err == ""
