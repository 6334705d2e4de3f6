"""Tile planner: which kernel configurations are valid for a spec on an arch,
how each is launched, and a heuristic pick for shapes never tuned.

A `Config` is everything the templates need beyond the spec. Each kernel
family (gemm, tma, rs, gemv, dequant: one module each, behind
registry.FAMILIES) derives its template constants from (spec, config) and
rejects what cannot work, with the reason (`geometry`); `plan` turns them
into the typed `Launch` that render, build and the runtime read.
`execution_spec` says how the kernels want a spec's weight stored
(execution.py). `candidates` enumerates the valid configs for a shape (space.py), and
`heuristic` picks one (heuristic.py) from rules fitted to the measurements
in hw.py.
"""
from .config import K_ALIGN, N_ALIGN, Config, PlanError, check_shape
from .execution import EXECUTION_SUFFIX, LAYOUTS, execution_spec, held_name, with_execution_specs
from .dequant import (DEQUANT, DEQUANT_8BIT, DEQUANT_KSPLIT, DEQUANT_THREADS, dense_twin,
                      dequant_config, stages)
from .heuristic import gemv_fill, heuristic, predecode_from
from .launch import Axis, Family, GridRule, Launch, TmaBoxes
from .registry import (FAMILIES, blocks, family_of, geometry, grid, grid_rule, kernel_numerics,
                       launch_smem, plan, shape_ok)
from .quantize import QUANTIZE_THREADS, quantize_plan
from .rs import RS_REGS, RS_STAGES, RS_TILES_K, RS_TILES_M, RS_TILES_N
from .space import PREDECODE_MIN_M, all_configs, candidates
from .tma import TMA_BLOCK_REGS, TMA_CONSUMER_REGS, TMA_DECODE_REGS, TMA_PRODUCER_REGS, tma_box_a

__all__ = [
    "K_ALIGN", "N_ALIGN", "Config", "PlanError", "check_shape",
    "EXECUTION_SUFFIX", "LAYOUTS", "execution_spec", "held_name", "with_execution_specs",
    "DEQUANT", "DEQUANT_8BIT", "DEQUANT_KSPLIT", "DEQUANT_THREADS", "dense_twin", "dequant_config", "stages",
    "gemv_fill", "heuristic", "predecode_from",
    "Axis", "Family", "GridRule", "Launch", "TmaBoxes",
    "FAMILIES", "blocks", "family_of", "geometry", "grid", "grid_rule", "kernel_numerics", "launch_smem",
    "plan", "shape_ok",
    "QUANTIZE_THREADS", "quantize_plan",
    "RS_REGS", "RS_STAGES", "RS_TILES_K", "RS_TILES_M", "RS_TILES_N",
    "PREDECODE_MIN_M", "all_configs", "candidates",
    "TMA_BLOCK_REGS", "TMA_CONSUMER_REGS", "TMA_DECODE_REGS", "TMA_PRODUCER_REGS", "tma_box_a",
]
