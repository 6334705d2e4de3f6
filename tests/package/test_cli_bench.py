"""`opgen bench`'s command line (opgen/cli/bench.py): registered with
`opgen`, --out required (a run writes nowhere it is not told to), the command
line recorded, no torch or cupy to parse it."""
import argparse
import subprocess
import sys

import pytest

from opgen import cli
from opgen.cli import bench as cli_bench


def parse(argv):
    p = argparse.ArgumentParser()
    cli_bench.add_arguments(p)
    return p.parse_args(argv)


def test_cli_registers_bench():
    args = cli.make_parser().parse_args(["bench", "--quick", "--Ms", "1,16", "--out", "x"])
    assert args._run is cli_bench.cmd_bench
    assert args.Ms == [1, 16] and args.out == "x" and args.entry == "opgen bench"


def test_out_is_required(capsys):
    for entry in (lambda: cli.main(["bench", "--quick"]), lambda: cli_bench.main(["--quick"])):
        with pytest.raises(SystemExit) as e:
            entry()
        assert e.value.code == 2 and "--out" in capsys.readouterr().err


def test_import_needs_neither_torch_nor_cupy():
    code = ("import sys; from opgen import cli; from opgen.bench import report; "
            "cli.make_parser().parse_args(['bench', '--quick', '--out', 'x']); "
            "report.markdown({'rows': [], 'targets': []}); "
            "print('torch' in sys.modules, 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/opgen", "bench", "--quick", "--out", "a b"])
    assert cli_bench.command_line(parse(["--out", "x"])) == "opgen bench --quick --out 'a b'"
    monkeypatch.setattr(sys, "argv", ["/x/opgen/bench/__main__.py", "--quick"])
    ns = parse(["--out", "x"])
    ns.entry = "python -m opgen.bench"
    assert cli_bench.command_line(ns) == "python -m opgen.bench --quick"
