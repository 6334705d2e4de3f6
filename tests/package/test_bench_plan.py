"""What `opgen bench` runs (opgen/bench/plan.py): the defaults, --quick,
explicit choices, the spec arguments."""
import argparse

import pytest

from opgen.bench import plan
from opgen.cli.bench import add_arguments
from opgen.codegen.errors import UserError


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_defaults_and_quick():
    args = parse(["--out", "x"])
    assert args.out == "x" and not args.quick and args.budget_ms > 0
    full = plan.resolve_plan(args, shipped_matmul=["a", "b"])
    assert full.specs == ("a", "b")
    assert full.shapes == ((4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))
    assert full.Ms == (1, 16, 32, 64, 128, 256, 1024, 4096)
    assert full.peers == plan.PEERS
    assert full.graph and full.pdl           # graph mode, with its PDL variant
    no_pdl = plan.resolve_plan(parse(["--no-pdl", "--out", "x"]), shipped_matmul=["a"])
    assert no_pdl.graph and not no_pdl.pdl

    quick = plan.resolve_plan(parse(["--quick", "--out", "x"]), shipped_matmul=["a"])
    assert quick.shapes == ((8192, 8192),) and quick.Ms == (1, 16, 64, 256, 4096)
    assert quick.specs == ("gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128",
                           "w2a16_g128", "w1a16_g128", "bitnet_b158", "bnb_nf4", "mxfp4", "w8a8_int8",
                           "fp8_e4m3_w8a8")
    # explicit choices win over --quick; Ms come out sorted; the baseline peer is always timed
    p = plan.resolve_plan(parse(["--quick", "--specs", "fp16", "--Ms", "64,1", "--shapes",
                                 "4096x4096", "--peers", "int_mm", "--out", "x"]))
    assert p.specs == ("fp16",) and p.Ms == (1, 64) and p.shapes == ((4096, 4096),)
    assert p.peers == ("cublas_fp16", "int_mm")
    with pytest.raises(SystemExit):
        parse(["--peers", "cutlass", "--out", "x"])


def test_default_specs_are_the_shipped_matmuls():
    names = plan.shipped_matmul_specs()
    assert "gptq_v2_w4a16_g128" in names and "fp16" in names
    assert not any(n.startswith("quantize_") for n in names)
    for n in plan.QUICK_SPECS:
        assert n in names


def test_matmul_specs():
    assert [s.name for s in plan.matmul_specs(["fp16", "bnb_nf4"])] == ["fp16", "bnb_nf4"]
    with pytest.raises(UserError, match="quantize_int8_row: op 'quantize' is not a matmul; "
                                        "opgen bench takes matmuls"):
        plan.matmul_specs(["quantize_int8_row"])
