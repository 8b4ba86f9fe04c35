"""Issue 39: the package stays a house a newcomer can find their way in. Its modules import each other without a
circle, and no module grows past what one reader holds in mind (300 lines).

The import graph is read from the sources (`ast`), never by importing them, so this runs in a second. A module's
imports are every `import kernelbench_eval...` and `from kernelbench_eval... import ...` it holds, an imported
name resolved to its module where it is one (`from kernelbench_eval.common import memory` is the module
`common.memory`), else to the package or module it comes from.

Two graphs, both asserted free of circles:

- **at import time**: the imports that run when the module is imported, so neither those inside a function nor
  those under `if TYPE_CHECKING:`. A circle here is a module that cannot be imported first.
- **every import**: the same plus the deferred ones (inside functions, under `TYPE_CHECKING`). Deferring an
  import is how a module keeps its import light (torch, Ray) or names a type for a checker, not a way around a
  circle: a circle among modules that call each other is one job split across two rooms, however it is imported.

The two sides of the process boundary live in two places and never import each other: `worker/` (what runs
inside a checker's or candidate's process) and the harness's `judge/`, `run/`, `cli/`, `results/`; what both use
is in `common/`, which imports neither. And every import of the package, in it, the tests and bench/, names a
module that exists and names it holds: a module moved between the two places cannot leave an import behind in a
branch only a GPU runs. No stage imports a later one (`STAGES`: discover, building, judge, results, run, cli).

No class grows past 150 lines either: one that does is doing more than one job (the checker's worker is split
by job: its input sets, its trials, its comparisons, `worker/`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "kernelbench_eval"
SOURCES = Path(__file__).resolve().parent.parent / PACKAGE
MAX_MODULE_LINES = 300
MAX_CLASS_LINES = 150


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCES.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(SOURCES.rglob("*.py"))}


def _owner(name: str) -> str | None:
    """The package module `name` is, or lies in (`kernelbench_eval.common.memory.plan` -> `...common.memory`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The package modules one import statement of `module` names."""
    if isinstance(node, ast.Import):
        return {owner for alias in node.names if (owner := _owner(alias.name))}
    base = node.module or ""
    if node.level:  # relative: from the importing module's package upwards
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    if base != PACKAGE and not base.startswith(PACKAGE + "."):
        return set()
    found = set()
    for alias in node.names:
        full = f"{base}.{alias.name}"
        owner = full if full in MODULES else _owner(base)
        if owner:
            found.add(owner)
    return found


def imports(module: str, at_import_time: bool) -> set[str]:
    """The package modules `module` imports (itself aside): at import time only, or every import it holds."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if at_import_time and (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                                   or isinstance(child, ast.If) and _is_type_checking(child)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.update(_imported(module, child))
            visit(child)

    visit(ast.parse(MODULES[module].read_text(), str(MODULES[module])))
    return found - {module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: each strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_graph_is_read_from_the_sources():
    """The reader itself: it finds imports of each form, relative ones included, and none of other packages."""
    assert len(MODULES) > 50 and f"{PACKAGE}.judge.judging" in MODULES
    judging = imports(f"{PACKAGE}.judge.judging", at_import_time=True)
    assert f"{PACKAGE}.judge.reference_side" in judging and f"{PACKAGE}.judge.candidate_run" in judging
    assert not any(name.startswith("torch") for name in judging)
    assert f"{PACKAGE}.common.memory" in imports(f"{PACKAGE}.judge.reference_side", at_import_time=True)  # a module
    assert f"{PACKAGE}.run.cluster" in imports(f"{PACKAGE}.run.pipeline", at_import_time=False)  # deferred
    assert f"{PACKAGE}.run.cluster" not in imports(f"{PACKAGE}.run.pipeline", at_import_time=True)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("at_import_time", [True, False], ids=["at import time", "every import"])
def test_no_module_of_the_package_imports_itself_round_a_circle(at_import_time: bool):
    graph = {module: imports(module, at_import_time) for module in MODULES}
    assert cycles(graph) == [], "import circles (each a group of modules that import each other)"


def test_no_module_is_over_300_lines():
    long = {str(path.relative_to(SOURCES.parent)): lines for path in MODULES.values()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by job"


def test_no_class_is_over_150_lines():
    long = {f"{path.relative_to(SOURCES.parent)}:{node.name}": node.end_lineno - node.lineno + 1
            for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES}
    assert long == {}, f"classes over {MAX_CLASS_LINES} lines: split them by job"


HARNESS = ("judge", "run", "cli", "results")  # the harness's own packages: never imported inside a worker


def _in(module: str, *packages: str) -> bool:
    return any(module == f"{PACKAGE}.{p}" or module.startswith(f"{PACKAGE}.{p}.") for p in packages)


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports across the process boundary: a worker module importing the harness's, the harness importing a
    worker module, or `common` importing either."""
    return sorted(f"{module} -> {dep}" for module, deps in graph.items() for dep in deps
                  if (_in(module, "worker") and _in(dep, *HARNESS)) or (_in(module, *HARNESS) and _in(dep, "worker"))
                  or (_in(module, "common") and _in(dep, "worker", *HARNESS)))


def test_the_two_sides_of_the_process_boundary_do_not_import_each_other():
    assert crossings({f"{PACKAGE}.worker.a": {f"{PACKAGE}.judge.b"}, f"{PACKAGE}.judge.b": {f"{PACKAGE}.worker.c"},
                      f"{PACKAGE}.common.d": {f"{PACKAGE}.run.e"}, f"{PACKAGE}.worker.f": {f"{PACKAGE}.common.d"}}) == [
        f"{PACKAGE}.common.d -> {PACKAGE}.run.e", f"{PACKAGE}.judge.b -> {PACKAGE}.worker.c",
        f"{PACKAGE}.worker.a -> {PACKAGE}.judge.b"]
    assert crossings({module: imports(module, at_import_time=False) for module in MODULES}) == []


def _bound(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (definitions, assignments, imports, also inside if/try)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo.extend(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return names


def unresolved(path: Path) -> list[str]:
    """The imports of the package in one source file that name a module or a name that does not exist."""
    bound = {module: None for module in MODULES}
    missing = []
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError:  # a fixture that is meant not to parse
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            missing += [a.name for a in node.names if a.name.startswith(PACKAGE) and a.name not in MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(PACKAGE):
            if node.module not in MODULES:
                missing.append(node.module)
                continue
            if bound[node.module] is None:
                bound[node.module] = _bound(ast.parse(MODULES[node.module].read_text()))
            missing += [f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" not in MODULES and a.name not in bound[node.module]]
    return missing


def test_every_import_of_the_package_resolves(tmp_path: Path):
    stale = tmp_path / "stale.py"
    stale.write_text(f"def f():\n    from {PACKAGE}.judge import timing\n"
                     f"    from {PACKAGE}.worker.percall import nothing\n")
    assert unresolved(stale) == [f"{PACKAGE}.judge.timing", f"{PACKAGE}.worker.percall.nothing"]
    root = SOURCES.parent
    sources = [*MODULES.values(), *sorted((root / "tests").rglob("*.py")), *sorted((root / "bench").rglob("*.py"))]
    assert {str(p.relative_to(root)): bad for p in sources if (bad := unresolved(p))} == {}


STAGES = ("discover", "building", "judge", "results", "run", "cli")  # the pipeline's order, the CLI on top


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a stage to a later one (`judge` importing `run`): a lower stage must not know a higher."""
    def rank(module: str) -> int | None:
        return next((i for i, stage in enumerate(STAGES) if _in(module, stage)), None)

    return sorted(f"{module} -> {dep}" for module, deps in graph.items() for dep in deps
                  if (low := rank(module)) is not None and (high := rank(dep)) is not None and high > low)


def test_no_stage_imports_a_later_one():
    assert upward({f"{PACKAGE}.judge.a": {f"{PACKAGE}.run.b", f"{PACKAGE}.building.c"}}) == [
        f"{PACKAGE}.judge.a -> {PACKAGE}.run.b"]
    assert upward({module: imports(module, at_import_time=False) for module in MODULES}) == []
