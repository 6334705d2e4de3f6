"""The layers import downward only: codegen (spec -> plan -> source -> cubin)
<- runtime (kernel, op, workbench, tuner, DB) <- the front ends (CLI, bench,
torch, checkpoints). And no import hides inside a function, except of the
optional heavy packages that a module must not need to be imported."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> its import name (pyproject.toml's package-dir)
PACKAGES = {"codegen": "opgen.codegen", "runtime": "opgen.runtime", "opgen": "opgen"}
LAYER = {"opgen.codegen": 0, "opgen.runtime": 1}          # everything else in opgen: 2
# optional heavy packages; opgen.torch, opgen.fused_linear and opgen.hf_checkpoint are
# the torch front ends (importing them imports torch)
LAZY_OK = ("cupy", "torch", "matplotlib", "ray", "transformers", "gemlite", "safetensors",
           "opgen.torch", "opgen.fused_linear", "opgen.hf_checkpoint")


def _modules():
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield path, ".".join([name, *parts]), path.name == "__init__.py"


def _layer(module: str) -> int:
    for prefix, layer in LAYER.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return 2                                   # the front ends, and the root package (opgen.load)


def _imports(path: Path, module: str, is_pkg: bool):
    """(imported module, line, inside a function) for every opgen import."""
    tree = ast.parse(path.read_text())
    package = module if is_pkg else module.rpartition(".")[0]
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = {id(n) for f in funcs for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [target]
            if node.module is None or node.level == 0:
                names += [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, id(node) in inner


def test_layers_import_downward_only():
    wrong = []
    for path, module, is_pkg in _modules():
        for name, line, _ in _imports(path, module, is_pkg):
            if name.startswith("opgen") and _layer(name) > _layer(module):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_no_import_hides_inside_a_function():
    hidden = []
    for path, module, is_pkg in _modules():
        for name, line, inside in _imports(path, module, is_pkg):
            if inside and not any(name == m or name.startswith(m + ".") for m in LAZY_OK):
                hidden.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not hidden, "\n".join(hidden)


@pytest.mark.parametrize("module,layer", [("opgen.codegen.planner.rs", 0), ("opgen.runtime.op", 1),
                                          ("opgen.cli.build", 2), ("opgen.torch", 2)])
def test_layer_of(module, layer):
    assert _layer(module) == layer
