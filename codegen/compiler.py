"""NVRTC compilation (through cupy.cuda.nvrtc, no GPU needed) and the on-disk
cubin cache.

The cache key covers everything that changes the binary: what the source is
rendered from (the spec, the config, the arch, and a fingerprint of the
codegen modules and templates), the NVRTC options, the NVRTC version and the
opgen version. So a cache hit needs no rendering: loading a tuned kernel in a
new process costs a file read, not a Jinja template compile. Writes are
atomic (temp file + os.replace), so a crash or a concurrent compile never
leaves a truncated cubin behind.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import List, Optional

import jinja2

from .version import __version__
from . import planner, render
from .files import write_atomic
from .spec import Spec


class CompileError(RuntimeError):
    """NVRTC rejected the source, or the kernel exceeds the arch's resources."""


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    name: str
    source: str
    log: str
    plan: planner.Launch      # how it is launched (planner.plan)
    arch: str

    @property
    def geometry(self) -> dict:
        """The template constants it was rendered from (the plan's)."""
        return self.plan.consts

    @property
    def resources(self) -> dict:
        return parse_ptxas(self.log)


def _nvrtc():
    try:
        from cupy.cuda import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the install
        raise CompileError("CuPy is not installed: pip install 'opgen[cuda12]' (or [cuda13])") from e
    return nvrtc


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    major, minor = _nvrtc().getVersion()
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def nvrtc_fingerprint() -> str:
    """NVRTC's version and the file this process loaded it from (Linux:
    /proc/self/maps; its name, size and modification time, not its 100 MB
    of content; elsewhere the version alone): a patch release keeps
    major.minor but may compile differently."""
    version = nvrtc_version()                 # (loads the library)
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return version
    libs = sorted({line.split()[-1] for line in maps.splitlines()
                   if re.search(r"/libnvrtc\.so[.\d]*$", line)})
    ids = [version]
    for lib in libs:
        with contextlib.suppress(OSError):
            st = os.stat(lib)
            ids.append(f"{lib.rsplit('/', 1)[-1]}:{st.st_size}:{st.st_mtime_ns}")
    return " ".join(ids)


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> List[str]:
    """Directories holding cuda_fp16.h / cuda_fp8.h: the pip CUDA runtime
    headers first, then a toolkit install."""
    found = []
    for base in sys.path:
        for pat in ("nvidia/cuda_runtime/include", "nvidia/cu13/include", "nvidia/cu12/include",
                    "nvidia/cuda_nvrtc/include"):
            d = os.path.join(base, pat)
            if os.path.isfile(os.path.join(d, "cuda_fp16.h")):
                found.append(d)
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "include"))
    found += sorted(glob.glob("/usr/local/cuda*/include"), reverse=True)
    out = []
    for d in found:
        if os.path.isfile(os.path.join(d, "cuda_fp16.h")) and d not in out:
            out.append(d)
    if not out:
        raise CompileError("no CUDA headers (cuda_fp16.h) found: pip install nvidia-cuda-runtime-cu12")
    return out[:1]


# The CUDA headers the templates include (through cuda_fp16.h and friends).
CUDA_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp8.h",
                "cuda_fp8.hpp")


def options(arch: str) -> List[str]:
    return [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v",
            "-default-device", *[f"-I{d}" for d in cuda_include_dirs()]]


@functools.lru_cache(maxsize=1)
def headers_fingerprint() -> str:
    """Hash of the CUDA headers' content: the cache key holds what the headers
    say, not where they are (two venvs of one install share a cache; a new
    header version misses)."""
    h = hashlib.sha256()
    for d in cuda_include_dirs():
        for name in CUDA_HEADERS:
            p = os.path.join(d, name)
            if os.path.isfile(p):
                h.update(name.encode() + b"\0" + Path(p).read_bytes())
    return h.hexdigest()


def cache_key(spec: Spec, cfg: Optional[planner.Config], arch: str, target: str,
              pdl: bool = False) -> str:
    """Everything that changes the binary: what the source is rendered from
    (pdl too: render's), the NVRTC options (less the include path), the
    headers' content, NVRTC (the library loaded) and opgen."""
    opts = [o for o in options(target) if not o.startswith("-I")]
    return hashlib.sha256("\0".join(
        [code_fingerprint(), repr(spec), repr(cfg), arch, f"pdl={pdl}", " ".join(opts),
         headers_fingerprint(), nvrtc_fingerprint(), __version__]).encode()).hexdigest()[:32]


def cache_dir() -> Path:
    root = os.environ.get("OPGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opgen")
    return Path(root) / "cubin"


_UNWRITABLE = set()          # cache directories already said to be unwritable


def _cache_unwritable(directory: Path, e: OSError) -> None:
    """Said once a directory: the cubin cache cannot be written there."""
    if directory in _UNWRITABLE:
        return
    _UNWRITABLE.add(directory)
    warnings.warn(f"opgen: the cubin cache {directory} cannot be written ({e.strerror or e}); kernels "
                  f"compile again in each process (OPGEN_CACHE_DIR sets another place)",
                  RuntimeWarning, stacklevel=3)


def nvrtc_compile(source: str, name: str, arch: str) -> tuple[bytes, str]:
    """Compile one translation unit to a cubin; returns (cubin, log)."""
    nvrtc = _nvrtc()
    opts = options(arch)
    prog = nvrtc.createProgram(source, name + ".cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise CompileError(f"NVRTC failed for {name} ({arch}):\n{nvrtc.getProgramLog(prog)}") from e
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    # CuPy's getCUBIN drops the last byte of the ELF image; restore the NUL.
    if len(cubin) % 4:
        cubin = bytes(cubin) + b"\0" * (4 - len(cubin) % 4)
    return bytes(cubin), log


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of every file the CUDA source is generated from: the codegen
    modules (subpackages too: planner/) and the templates (and the Jinja
    version that renders them)."""
    h = hashlib.sha256(jinja2.__version__.encode())
    for pkg in ("opgen.codegen", "opgen.templates"):
        for name, data in _package_files(resources.files(pkg)):
            h.update(name.encode() + b"\0" + data)
    return h.hexdigest()


def _package_files(root, prefix: str = ""):
    """(path under root, bytes) of every file below root, subfolders
    included, in a fixed order; no bytecode."""
    for f in sorted(root.iterdir(), key=lambda f: f.name):
        if f.is_dir() and f.name != "__pycache__":
            yield from _package_files(f, f"{prefix}{f.name}/")
        elif f.is_file() and not f.name.endswith(".pyc"):
            yield prefix + f.name, f.read_bytes()


def _digest(cubin: bytes, source: str, log: str) -> str:
    """One cache entry's sha256: its cubin, source and ptxas log together
    (the log tells default_config of spills, build copies the source)."""
    h = hashlib.sha256()
    for part in (cubin, source.encode(), log.encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _read_entry(path: Path, log_path: Path, src_path: Path, sum_path: Path):
    """(cubin, source, log) of a complete cache entry whose files are the
    ones written (an ELF image, and the recorded sha256 of all three), else
    None: a truncated, emptied or overwritten file is compiled again, never
    served."""
    try:
        cubin, source, log = path.read_bytes(), src_path.read_text(), log_path.read_text()
        if cubin[:4] != b"\x7fELF" or sum_path.read_text().strip() != _digest(cubin, source, log):
            return None
        return cubin, source, log
    except (OSError, UnicodeDecodeError):
        return None


def compile_kernel(spec: Spec, cfg: Optional[planner.Config], arch: str,
                   use_cache: bool = True, pdl: bool = False) -> Compiled:
    """Render + compile (or take from the cache) one kernel; cfg is None for
    op quantize (a config of several kernels: compile_config). pdl: the
    kernel for a programmatic dependent launch (render's)."""
    if cfg is not None and cfg.predecode:
        raise ValueError(f"{cfg.name} launches several kernels: use compile_config")
    source = None
    if spec.op == "quantize":
        plan = planner.quantize_plan(arch)
        source, g = render.render_quantize(spec, arch, plan.threads, pdl=pdl)
        name = g["name"]
    else:
        name, plan = render.kernel_name(spec, cfg), planner.plan(spec, cfg, arch)
    target = plan.target                      # e.g. sm_90a for wgmma kernels
    key = cache_key(spec, cfg, arch, target, pdl)
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    log_path, src_path, sum_path = (path.with_suffix(".log"), path.with_suffix(".cu"),
                                    path.with_suffix(".sha256"))
    if use_cache:
        hit = _read_entry(path, log_path, src_path, sum_path)
        if hit is not None:
            return Compiled(hit[0], name, hit[1], hit[2], plan, arch)
    if source is None:
        source, _ = render.render(spec, cfg, arch, plan=plan, pdl=pdl)
    cubin, log = nvrtc_compile(source, name, target)
    res = parse_ptxas(log)
    if res.get("spill_bytes", 0) > 0 or res.get("stack", 0) > 0:
        # Spills and local-memory arrays are a planner bug for a default config,
        # but not a correctness problem: keep the kernel, flag it in the log.
        log += "\nopgen: warning: local memory in use\n"
    if use_cache:
        try:
            # The cubin last: its presence (with the others) marks a complete entry.
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(log_path, log)
            write_atomic(src_path, source)
            write_atomic(sum_path, _digest(cubin, source, log))
            write_atomic(path, cubin)
        except OSError as e:        # (the kernel is fine: it only compiles again next time)
            _cache_unwritable(path.parent, e)
    return Compiled(cubin, name, source, log, plan, arch)


def spills(compiled: List[Compiled]) -> bool:
    """Whether ptxas gave any kernel of a config local memory (spills or a
    stack frame)."""
    return any(c.resources.get("spill_bytes", 0) or c.resources.get("stack", 0) for c in compiled)


# How many heuristic picks default_config compiles before it settles for one that spills.
DEFAULT_PICK_TRIES = 4


def default_config(spec: Spec, arch: str, M: int, N: int, K: int, sms: Optional[int] = None
                   ) -> planner.Config:
    """What runs without a tuning record: the heuristic's pick, passing over
    configs whose compiled kernels spill (ptxas's report; the heuristic's
    register rules do not foresee every case) for its next pick, up to
    DEFAULT_PICK_TRIES; if all of those spill, its first. `opgen build` and
    the op both choose by it (the kernels are compiled anyway; the cache
    keeps them)."""
    passed = []
    cfg = planner.heuristic(spec, arch, M, N, K, sms)
    for _ in range(DEFAULT_PICK_TRIES):
        if not spills(compile_config(spec, cfg, arch)):
            return cfg
        passed.append(cfg)
        try:
            cfg = planner.heuristic(spec, arch, M, N, K, sms, exclude=frozenset(passed))
        except planner.PlanError:
            break
    return passed[0]


def compile_config(spec: Spec, cfg: Optional[planner.Config], arch: str,
                   pdl: bool = False) -> List[Compiled]:
    """Every kernel one config launches, in launch order (planner.stages):
    one, or for a predecode config the dequant stage and the dense GEMM
    (cfg None: the kernel of op quantize; pdl: compile_kernel's)."""
    if cfg is None:
        return [compile_kernel(spec, None, arch, pdl=pdl)]
    return [compile_kernel(s, c, arch, pdl=pdl) for s, c in planner.stages(spec, cfg)]


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "smem_static": re.compile(r"(\d+) bytes smem"),
}


def parse_ptxas(log: str) -> dict:
    out = {}
    for k, rx in _PTXAS.items():
        m = rx.search(log)
        if m:
            out[k] = int(m.group(1))
    out["spill_bytes"] = out.get("spill_stores", 0) + out.get("spill_loads", 0)
    return out


def find_nvdisasm() -> Optional[str]:
    for base in sys.path:
        for sub in ("nvidia/cu13/bin/nvdisasm", "nvidia/cuda_nvdisasm/bin/nvdisasm"):
            p = os.path.join(base, sub)
            if os.path.isfile(p):
                return p
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (nvdisasm from the `sass` extra or the toolkit)."""
    tool = find_nvdisasm()
    if tool is None:
        raise CompileError("nvdisasm not found: pip install 'opgen[sass]'")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], check=True, capture_output=True, text=True).stdout


def _compile_job(spec: Spec, cfg: planner.Config, arch: str, pdl: bool = False) -> Optional[str]:
    try:
        compile_config(spec, cfg, arch, pdl=pdl)
    except (CompileError, planner.PlanError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def compile_many(jobs, workers: Optional[int] = None):
    """Compile (spec, config, arch) jobs into the cubin cache on all CPU cores
    ((spec, config, arch, True): the kernels for a programmatic dependent
    launch, compile_kernel's pdl).

    Yields (job, None | why it failed) as each finishes. NVRTC is CPU work, so a
    process pool scales with cores; 'spawn' because the parent may hold a CUDA
    context, which must not be forked."""
    jobs = list(jobs)
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield job, _compile_job(*job)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as ex:
        futures = {ex.submit(_compile_job, *job): job for job in jobs}
        try:
            for fut in as_completed(futures):
                try:
                    why = fut.result()
                except Exception as e:          # a crashed worker (BrokenProcessPool)
                    why = f"{type(e).__name__}: {e}"
                yield futures[fut], why
        except GeneratorExit:               # the caller stopped early: drop the queued jobs
            for fut in futures:             # (not ex.shutdown(cancel_futures=True): the with
                fut.cancel()                # block's own shutdown would undo it)
            raise
