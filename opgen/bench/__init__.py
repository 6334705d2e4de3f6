"""`opgen bench` (also `python -m opgen.bench`): opgen's kernels against the
peers on one GPU, in one process, on the same shapes.

For every (spec, N, K, M) it times the kernel `opgen.load(spec, N, K)` picks
(tuning-DB winner or the planner's heuristic; which one is recorded), and for
every (N, K, M) the peers: cuBLAS fp16 / bf16 (`torch.mm`), tinygemm int4
(`torch._weight_int4pack_mm`), cuBLASLt int8 (`torch._int_mm`), fp8
(`torch._scaled_mm`) and the unfused BMINF-style W8A8 pipeline (per-row
quantize in torch ops, `torch._int_mm`, scale).  In the same run it measures
the machine: device-to-device copy bandwidth and the dense fp16 / int8 / fp8
matmul ceilings (cuBLAS at 8192^3), from which each row's floor is
max(bytes moved / copy bandwidth, flops / ceiling).  Writes bench.json,
bench.md, speedup.png and floor.png to --out.

Timing: runtime.tuner's _Timer (CUDA events; launches queued behind a spin
kernel so Python's launch cost is hidden; median of samples; a device-time
budget per measurement), with several copies of every input rotated so that
one launch does not find the previous launch's data in L2.

Layout (only runner.py touches torch and cupy, inside functions, so every
module imports without them and the pure parts are tested on CPU):
  plan.py      options, the default / --quick specs, shapes and Ms, the peers
  roofline.py  bytes moved, flops, ceilings, floors, each row's ratios
  targets.py   the issue's targets and their evaluation
  report.py    bench.json, bench.md, the plots
  verify.py    the tiled reference data and the check of output rows
  runner.py    the GPU side (_Gpu): machine, peers, opgen's rows, precompile
  entry.py     run (`opgen bench`) and main (`python -m opgen.bench`)
"""
from opgen.bench.entry import _command_line, main, run
from opgen.bench.plan import (BASELINE, DEFAULT_BUDGET_MS, DEFAULT_MEM_CAP_GB, DEFAULT_MS,
                              DEFAULT_OUT, DEFAULT_SHAPES, PEER_LABELS, PEERS, QUICK_MS,
                              QUICK_SHAPES, QUICK_SPECS, Plan, _load_specs, add_arguments,
                              parse_ints, parse_names, parse_shapes, resolve_plan,
                              shipped_matmul_specs)
from opgen.bench.report import (linear_table, markdown, peers_table, plot, results_table,
                                targets_section, write_outputs)
from opgen.bench.roofline import (PEAK_FOR_ACT, bytes_moved, finish_row, floors, matmul_flops,
                                  peak_for, relevant_peer, storage_bytes, stored_shapes)
from opgen.bench.runner import _Gpu, quantize_spec_for
from opgen.bench.targets import TARGET_SHAPE, TARGETS, W4_SPECS, Target, evaluate_targets
from opgen.bench.verify import (BASE_LIMIT, base_rows, base_shape, check_rows, check_rows_of,
                                tile_to)
