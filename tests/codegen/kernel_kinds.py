"""One shipped (spec, config, arch) of each kind of kernel (render.TEMPLATES'
keys but op quantize's), for the tests that render every template: found by
walking the planner's candidates, so it follows the planner."""
import functools

from opgen.codegen import planner, render
from opgen.codegen.resolve import as_spec

# (spec, arch, M): among them every kind has a candidate (checked by the users)
_SEARCH = [("w4a16_sym_g128", "sm_90", 1), ("w4a16_sym_g128", "sm_90", 16),
           ("w4a16_sym_g128", "sm_90", 256), ("awq_w4a16_g128", "sm_90", 1),
           ("awq_w4a16_g128", "sm_90", 4096), ("fp16", "sm_90", 256), ("w8a8_int8", "sm_80", 256),
           ("bitnet_b158_a8", "sm_90", 1)]


@functools.lru_cache(maxsize=1)
def one_of_each_kind() -> dict:
    """{kind: (spec, config, arch)} for every kind of matmul kernel."""
    found = {}
    for name, arch, M in _SEARCH:
        for cfg in planner.candidates(as_spec(name), arch, M, 4096, 4096):
            for s, c in planner.stages(as_spec(name), cfg):
                found.setdefault(planner.plan(s, c, arch).kind, (s, c, arch))
    return found


MATMUL_KINDS = sorted(k for k in render.TEMPLATES if k != "quantize")
