"""The tests mirror the source tree file for file.

Each source module has exactly one test file, at the mirrored path, and
each test file tests one source module; a module's GPU tests are in its
test file, marked `gpu` (no separate *_gpu.py):

  codegen/X.py, codegen/planner/X.py  -> tests/codegen/test_X.py, tests/codegen/planner/test_X.py
  runtime/X.py                        -> tests/runtime/test_X.py
  opgen/X.py                          -> tests/package/test_X.py
  opgen/P/X.py (P: bench, cli)        -> tests/package/test_P_X.py (P/__init__.py: test_P.py)
  bench/X.py (lab scripts: optional)  -> tests/bench/test_X.py

tests/package is not called tests/opgen: that folder would shadow the opgen
package (pyproject.toml's pytest section). Cross-cutting tests are named
below; files not named test_*.py are helpers. Test modules are imported by
their folder's position (pytest's default import mode), so their import
names must not clash: a mirrored subfolder is a package (__init__.py)."""
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MIRRORED = {"codegen": "codegen", "runtime": "runtime", "opgen": "package", "bench": "bench"}
REQUIRED = ("codegen", "runtime", "opgen")            # bench/: lab scripts, tests optional
CROSS_CUTTING = {"test_layers.py", "test_mirror.py", "codegen/test_render_snapshot.py",
                 "codegen/test_fuzz_specs.py"}
CROSS_CUTTING_DIRS = ("perf",)                       # the performance targets (GPU)


def mirrored_test(src: Path) -> Path:
    """The test file of a source module (an opgen subpackage's __init__.py:
    the package's own test file)."""
    top, *mid, name = src.relative_to(ROOT).parts
    stem = name[: -len(".py")]
    if top == "opgen":
        parts = mid + ([] if stem == "__init__" else [stem])
        return TESTS / "package" / f"test_{'_'.join(parts)}.py"
    return TESTS.joinpath(MIRRORED[top], *mid, f"test_{stem}.py")


def _sources(top: str):
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _modules_needing_tests():
    for top in REQUIRED:
        for p in _sources(top):
            if p.name not in ("__init__.py", "__main__.py"):
                yield p


def _test_files():
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def test_every_module_has_its_test_file():
    missing = [f"{p.relative_to(ROOT)}: no {mirrored_test(p).relative_to(ROOT)}"
               for p in _modules_needing_tests() if not mirrored_test(p).is_file()]
    assert not missing, "\n".join(missing)


def test_every_test_file_has_its_module():
    owners = {}
    for top in MIRRORED:
        for p in _sources(top):
            # a package's own test file: opgen's subpackages only (their
            # __init__.py holds code: the `opgen` command's table)
            package_ok = top == "opgen" and p.parent != ROOT / "opgen"
            if p.name == "__main__.py" or (p.name == "__init__.py" and not package_ok):
                continue
            owners.setdefault(mirrored_test(p), []).append(p.relative_to(ROOT))
    ambiguous = {t: srcs for t, srcs in owners.items() if len(srcs) > 1}
    assert not ambiguous, ambiguous
    stray = []
    for t in _test_files():
        rel = t.relative_to(TESTS)
        if rel.as_posix() in CROSS_CUTTING or rel.parts[0] in CROSS_CUTTING_DIRS:
            continue
        if t not in owners:
            stray.append(f"tests/{rel.as_posix()}: no source module at a mirrored path")
    assert not stray, "\n".join(stray)


def test_import_names_do_not_clash():
    """pytest (prepend import mode) imports a test or helper module by its
    path below the first folder upwards without an __init__.py: two of one
    name would collide."""
    names = []
    for p in TESTS.rglob("*.py"):
        if "__pycache__" in p.parts or p.name in ("__init__.py", "conftest.py"):
            continue
        parts, d = [p.stem], p.parent
        while (d / "__init__.py").is_file():
            parts.insert(0, d.name)
            d = d.parent
        names.append(".".join(parts))
    clashes = [n for n, c in Counter(names).items() if c > 1]
    assert not clashes, clashes


def test_mirrored_subfolders_are_packages():
    for d in TESTS.rglob("*"):
        # (tool caches: __pycache__, hypothesis' .hypothesis when run from a subfolder)
        hidden = any(p.startswith(".") or p == "__pycache__" for p in d.relative_to(TESTS).parts)
        if d.is_dir() and not hidden and d.parent != TESTS:
            assert (d / "__init__.py").is_file(), f"{d.relative_to(ROOT)} needs an __init__.py"


def test_the_mapping():
    assert (mirrored_test(ROOT / "codegen" / "planner" / "rs.py")
            == TESTS / "codegen" / "planner" / "test_rs.py")
    assert mirrored_test(ROOT / "runtime" / "kernel.py") == TESTS / "runtime" / "test_kernel.py"
    assert mirrored_test(ROOT / "opgen" / "torch.py") == TESTS / "package" / "test_torch.py"
    assert mirrored_test(ROOT / "opgen" / "cli" / "build.py") == TESTS / "package" / "test_cli_build.py"
    assert mirrored_test(ROOT / "opgen" / "cli" / "__init__.py") == TESTS / "package" / "test_cli.py"
    assert mirrored_test(ROOT / "bench" / "ablate.py") == TESTS / "bench" / "test_ablate.py"
