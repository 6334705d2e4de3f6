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


# --- --e2e ---------------------------------------------------------------------------------------


def test_e2e_plan_defaults_and_choices():
    from opgen.bench import e2e
    from opgen.bench.e2e_variants import DEFAULT_VARIANTS
    p = cli_bench.e2e_plan(parse(["--e2e", "--out", "x"]))
    assert p.model == e2e.DEFAULT_MODEL and p.config["hidden_size"] == 4096
    assert (tuple(p.batches), p.prompt, p.new_tokens) == (e2e.DEFAULT_BATCHES, 128, 64)
    assert tuple(p.variants) == DEFAULT_VARIANTS and p.accuracy and not p.load_time and p.compile
    p = cli_bench.e2e_plan(parse(["--e2e", "--out", "x", "--layers", "2", "--batches", "1,4",
                                  "--variants", "fp16,opgen:bnb_nf4", "--no-accuracy",
                                  "--new-tokens", "8", "--prompt", "16", "--load-time", "--no-compile"]))
    assert p.config["num_hidden_layers"] == 2 and list(p.batches) == [1, 4] and not p.compile
    assert list(p.variants) == ["fp16", "opgen:bnb_nf4"] and not p.accuracy and p.load_time
    assert (p.prompt, p.new_tokens) == (16, 8)


@pytest.mark.parametrize("argv,msg", [
    (["--e2e", "--specs", "bnb_nf4"], "--specs: kernel-bench options"),
    (["--e2e", "--variants", "fp16,int3"], "--variants: unknown variant 'int3'"),
    (["--e2e", "--variants", "opgen:no_such_spec"], "no_such_spec"),
    (["--e2e", "--model", "gpt-9"], "--model gpt-9: neither a shipped model"),
    (["--model", "llama-3-8b"], "--model: options of --e2e"),
    (["--batches", "1"], "--batches: options of --e2e"),
])
def test_e2e_option_errors_are_one_line_exit_2(argv, msg, capsys, tmp_path):
    assert cli.main(["bench", "--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_e2e_without_a_gpu_is_one_line_exit_2(capsys, monkeypatch, tmp_path):
    """No CUDA device: refused before any model is built, nothing written."""
    monkeypatch.setattr(cli_bench, "has_gpu", lambda: False)
    monkeypatch.setattr(cli_bench.e2e, "main", lambda *a, **k: pytest.fail("ran"))
    assert cli.main(["bench", "--e2e", "--out", str(tmp_path / "out"), "--layers", "1"]) == 2
    err = capsys.readouterr().err
    assert "opgen: error: opgen bench --e2e needs a CUDA GPU" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
