"""How `opgen bench` writes a failure (opgen/bench/failures.py): the
exception's type and the first line of its message, cut short; never a
traceback or the rest of a long compiler log."""
from opgen.bench.failures import short_error


class CompileError(RuntimeError):
    pass


def test_type_and_first_line():
    log = "kernel.cu(12): error: identifier \"x\" is undefined\n" + "ptxas info: ...\n" * 200
    first = 'CompileError: kernel.cu(12): error: identifier "x" is undefined'
    assert short_error(CompileError(log)) == first


def test_cut_short():
    e = ValueError("x" * 1000)
    assert short_error(e) == ("ValueError: " + "x" * 1000)[:300]
    assert short_error(e, 20) == "ValueError: xxxxxxxx" and len(short_error(e, 20)) == 20


def test_no_message():
    assert short_error(KeyboardInterrupt()) == "KeyboardInterrupt:"
    assert short_error(RuntimeError("\nsecond line only")).rstrip() == "RuntimeError:"
