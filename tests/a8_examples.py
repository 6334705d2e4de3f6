"""The shipped specs of 8-bit activations with sub-byte weights (issue 29),
by name, as paths. Test modules import this as
`from a8_examples import A8_PATHS` (tests/ is on sys.path: conftest.py)."""
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.spec import A8_DTYPES, SUB_BYTE_INT_DTYPES


def _a8(path) -> bool:
    s = load_spec(path)
    return s.op == "matmul" and s.a.dtype in A8_DTYPES and s.b.dtype in SUB_BYTE_INT_DTYPES


A8_PATHS = {n: p for n, p in shipped_specs().items() if _a8(p)}
