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
bench.md, speedup.png and floor.png to --out (nowhere else).

Timing: runtime.timing.Timer (CUDA events; launches queued behind a spin
kernel so Python's launch cost is hidden; median of samples; a device-time
budget per measurement), with several copies of every input rotated so that
one launch does not find the previous launch's data in L2.  opgen's rows run
on the runtime workbench (runtime/workbench.py), as the tuner's and the GPU
tests' do.

Layout (runner.py and the modules it drives touch torch and cupy, inside
runner.Gpu only, so every module imports without them and the pure parts are
tested on CPU):
  plan.py        the default / --quick specs, shapes and Ms, the peers, the Plan
  roofline.py    bytes moved, flops, ceilings, floors, each row's ratios
  targets.py     the performance targets and their evaluation (the report's
                 Targets section; tests/perf/ holds them to it on a GPU)
  report.py      bench.json, bench.md, the plots
  runner.py      the GPU side (Gpu): environment, timing, memory
  machine.py     copy bandwidth, matmul ceilings, the read-only kernel's time
  peers.py       the peers' rows
  opgen_rows.py  opgen's rows (op and fused linear), on the workbench
  graph.py       graph mode: L distinct layers in one CUDA graph, µs per layer
  precompile.py  compiling ahead while the peers are timed
  failures.py    how a failure is written into a row
  entry.py       run: plan, time, write the outputs
The command line is opgen/cli/bench.py.
"""
