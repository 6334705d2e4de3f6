"""The fingerprint of the code a config runs: its rendered CUDA, less comments
and layout, with the launch constants the planner gives each kernel.

A tuning record stores it (runtime/tuning_db.py), so a record is served only
while its config still renders to the kernel it was measured on, whichever
NVRTC compiles it; the render snapshot (tests/codegen/render_snapshot.py)
hashes the shipped kernels with the same digest.
"""
from __future__ import annotations

import hashlib
import json
import re

from . import planner, render
from .spec import Spec

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_SPACE_AROUND = re.compile(r"\s*([^\w\s])\s*")
_SPACE = re.compile(r"\s+")


def normalize(src: str) -> str:
    """The source less comments and layout: runs of whitespace become one
    space, and none is kept next to punctuation."""
    src = _COMMENT.sub(" ", src)
    return _SPACE_AROUND.sub(r"\1", _SPACE.sub(" ", src)).strip()


def digest(src: str) -> str:
    return hashlib.sha256(normalize(src).encode()).hexdigest()[:20]


def config_source_hash(spec: Spec, cfg: planner.Config, arch: str) -> str:
    """The hash of every kernel the config launches (planner.stages): each
    one's source digest, threads, shared memory and compile target. Raises
    what rendering raises (PlanError for a config the kernels cannot run)."""
    kernels = []
    for s, c in planner.stages(spec, cfg):
        # The kernel as render gives it without pdl: a programmatic dependent
        # launch (render's pdl) runs the same tile config, only its start
        # overlaps the previous kernel's end, so a record serves either way.
        src, g = render.render(s, c, arch)
        kernels.append([digest(src), g["threads"], g.get("smem", 0), g.get("target", arch)])
    return hashlib.sha256(json.dumps(kernels).encode()).hexdigest()[:20]
