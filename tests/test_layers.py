"""The package's layer rule, checked on the source of every module under src/hearth (no imports run, CPU only).

Layers, bottom up; a module imports from its own layer or below, never above:

    0  hearth.kernels, hearth.envelope, hearth.durable, and the root modules beside them (hearth.prompts,
       hearth.envelope_stream, hearth.companion_rules, hearth.prompt_budget): kernels import nothing of hearth but
       kernels; a root module of this layer imports nothing of hearth but the other root modules of this layer
    1  hearth.nn, hearth.patch, hearth.inspect, hearth.bench
    2  hearth.train, hearth.evals
    3  hearth.gateway
    4  hearth.app
    5  hearth.cli

Every import counts: ``import hearth.x``, ``from hearth.x import y`` (``from hearth import x`` is hearth.x when x is a
module), relative imports, imports inside functions (lazy ones), and ``importlib.import_module("hearth.x")`` with a
literal name (or an f-string's literal prefix). Besides, nothing the app imports, directly or through the hearth
modules it imports (lazily included), is hearth.kernels or hearth.train or imports torch, triton, transformers or
peft: the app runs on a web host without the training stack.

The bench's runtime probe (tests/bench/test_bench_layers.py) stays: it checks what importing the bench's report
modules loads at run time, which a reading of the source cannot see (a module a dependency loads on its own).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# (module prefix, layer): the longest matching prefix decides
LAYERS: dict[str, int] = {
    "hearth": 0,  # the package's __init__ (imports nothing)
    "hearth.kernels": 0,
    "hearth.envelope": 0,
    "hearth.durable": 0,
    "hearth.prompts": 0,
    "hearth.envelope_stream": 0,
    "hearth.companion_rules": 0,  # the app's rules the corpus builder follows too (ladder, text limits, bounds)
    "hearth.prompt_budget": 0,  # the largest system prompt a budget must hold (app start-up and corpus build)
    "hearth.nn": 1,
    "hearth.patch": 1,
    "hearth.inspect": 1,
    "hearth.bench": 1,
    "hearth.train": 2,
    "hearth.evals": 2,
    "hearth.gateway": 3,
    "hearth.app": 4,
    "hearth.cli": 5,
}
# the layer-0 modules at the package root: what of hearth they may import (each other, never the kernels)
BOTTOM_ROOT_ALLOWED = {"hearth.envelope", "hearth.durable", "hearth.prompts", "hearth.envelope_stream",
                       "hearth.companion_rules", "hearth.prompt_budget"}
APP_FORBIDDEN_PACKAGES = {"torch", "triton", "transformers", "peft"}
APP_FORBIDDEN_MODULES = ("hearth.kernels", "hearth.train")

# Upward imports that are known and not fixed yet, (importer, imported): each must still exist (a fixed one is
# taken off this list). None now: the corpus builder's imports of the app's relationship ladder, text limits and
# settings bounds went when those moved down to hearth.companion_rules, which the app and the builder both import.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "hearth").rglob("*.py"))}


def _static_name(node: ast.expr) -> str | None:
    """The module name of importlib.import_module's argument, as far as it is literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rstrip(".") or None
    return None


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """[(imported module, line)] for every import in the module `name` (hearth's and third-party ones)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((sub if sub in known else module, node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "importlib"):
            target = _static_name(node.args[0])
            if target:
                out.append((target, node.lineno))
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        layer = LAYERS.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    return None


@lru_cache(maxsize=1)
def _graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _is_hearth(module: str) -> bool:
    return module == "hearth" or module.startswith("hearth.")


def _upward(graph) -> tuple[list[str], set[tuple[str, str]]]:
    problems: list[str] = []
    upward: set[tuple[str, str]] = set()
    for importer, imports in sorted(graph.items()):
        mine = _layer(importer)
        if mine is None:
            problems.append(f"{importer}: in no layer (add it to LAYERS in tests/test_layers.py)")
            continue
        for imported, line in imports:
            if not _is_hearth(imported):
                continue
            theirs = _layer(imported)
            if theirs is None:
                problems.append(f"{importer}:{line} -> {imported}: the imported module is in no layer")
            elif theirs > mine:
                upward.add((importer, imported))
                if (importer, imported) not in KNOWN_UPWARD:
                    problems.append(f"{importer}:{line} -> {imported} (layer {mine} imports layer {theirs})")
            elif mine == 0 and imported != importer:
                if importer.startswith("hearth.kernels"):
                    if not imported.startswith("hearth.kernels"):
                        problems.append(f"{importer}:{line} -> {imported} (kernels import nothing of hearth but "
                                        "kernels)")
                elif importer != "hearth" and imported not in BOTTOM_ROOT_ALLOWED:
                    problems.append(f"{importer}:{line} -> {imported} (a bottom root module imports nothing of "
                                    f"hearth but {sorted(BOTTOM_ROOT_ALLOWED)})")
    return list(dict.fromkeys(problems)), upward


def test_every_import_points_down():
    problems, _ = _upward(_graph())
    assert not problems, "imports that break the layer rule (importer -> imported):\n  " + "\n  ".join(problems)


def test_known_upward_imports_still_exist():
    """A known violation that is gone is taken off KNOWN_UPWARD, so it cannot come back unnoticed."""
    _, upward = _upward(_graph())
    stale = sorted(KNOWN_UPWARD - upward)
    assert not stale, f"no longer imported, take them off KNOWN_UPWARD: {stale}"


def test_the_app_pulls_in_no_training_stack():
    graph = _graph()
    problems: list[str] = []
    for root in sorted(m for m in graph if m.startswith("hearth.app")):
        seen, todo, via = {root}, [root], {root: None}
        while todo:
            module = todo.pop()
            for imported, line in graph.get(module, []):
                top = imported.partition(".")[0]
                chain = " -> ".join(_path(via, module))
                if top in APP_FORBIDDEN_PACKAGES:
                    problems.append(f"{chain}:{line} imports {imported}")
                elif imported.startswith(APP_FORBIDDEN_MODULES):
                    problems.append(f"{chain}:{line} imports {imported}")
                elif _is_hearth(imported) and imported not in seen and imported in graph:
                    seen.add(imported)
                    via[imported] = module
                    todo.append(imported)
    problems = sorted(set(problems))
    assert not problems, "the app reaches the training stack:\n  " + "\n  ".join(problems)


def _path(via: dict[str, str | None], module: str) -> list[str]:
    out = [module]
    while via[out[-1]] is not None:
        out.append(via[out[-1]])
    return out[::-1]
