"""The argument types shared by the subcommands (opgen/cli/args.py)."""
import argparse

import pytest

from opgen.cli.args import parse_ints, parse_names, parse_shapes, positive_float, positive_int


def test_parse_shapes_and_ints():
    assert parse_shapes("8192x8192, 4096X14336,8192*28672") == [
        (8192, 8192), (4096, 14336), (8192, 28672)]
    assert parse_shapes("64x64,64x64") == [(64, 64)]
    assert parse_ints("1,16, 64,16") == [1, 16, 64]
    for bad in ("8192", "axb", "0x8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shapes(bad)
    for bad in ("0", "1,x", "", "-4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_ints(bad)


def test_positive_numbers_and_names():
    assert positive_int("0x10") == 16 and positive_float("2.5") == 2.5
    assert parse_names("a, b,a") == ["a", "b"]
    for fn, bad in ((positive_int, "0"), (positive_int, "x"), (positive_float, "0"),
                    (positive_float, "nan?"), (positive_float, "nan"), (positive_float, "inf"),
                    (positive_float, "1e309"), (parse_names, ",")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(bad)
