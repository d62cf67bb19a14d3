"""The house rules the layout promises, checked on the source itself: no module past 500 lines,
no import cycle between modules, imports running one way down the package levels (cli ->
pipeline -> stages -> records/config/errors), SQL only in store/, no torch or HTTP client in the
pure core."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from conftest import ROOT

SRC = ROOT / "src" / "draftdata"
MAX_LINES = 500
#: the pure core imports no HTTP client, database or torch (DESIGN.md)
PURE = ("tokenizers", "formats", "tokens", "measure", "records")
IMPURE = ("sqlite3", "aiohttp", "httpx", "torch", "transformers", "starlette", "uvicorn")
#: draftdata's packages bottom to top: a package imports only packages on a lower level. A
#: top-level module (version.py, errors.py, files.py, pipeline.py, __main__.py) is a package of
#: its own; "draftdata" is the root package itself, whose names ``front`` imports on first use
#: (``load_target``, ``open_run``): above every package they come from, below the CLI.
LEVELS: tuple[tuple[str, ...], ...] = (
    ("version",),
    ("errors",),
    ("files", "progress", "nesting"),
    ("lines",),
    ("records",),
    ("config",),
    ("tokenizers", "sources", "store", "shown"),
    ("formats",),
    ("tokens",),
    ("session",),
    ("measure",),
    ("model",),
    ("generate",),
    ("export",),
    ("hidden", "report", "devtools", "acceptance"),
    ("pipeline",),
    ("front",),
    ("draftdata",),
    ("cli",),
    ("__main__",),
)


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def top_level_imports(name: str, path: Path) -> set[str]:
    """Modules imported when ``name`` is imported (module level, outside TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if _type_checking(node):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_imported(node, package))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    """What one import statement names, relative imports resolved against ``package``: each
    module, and for ``from M import x`` both ``M`` and ``M.x`` (x may be a submodule)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return {mod} | {f"{mod}.{a.name}" for a in node.names}


def all_imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports anywhere: at module level, inside functions (lazy
    imports) and under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(node, package))
    return found


def package_of(module: str) -> str:
    """``draftdata.X...`` -> X; the root package is "draftdata"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_edges() -> dict[tuple[str, str], set[str]]:
    """(importer's package, imported package) -> the imports behind it, "module -> module"."""
    mods = modules()
    edges: dict[tuple[str, str], set[str]] = {}
    for name, path in mods.items():
        for target in all_imports(name, path):
            # a name imported from a module is that module; a name from "draftdata" is the root
            while target and target not in mods:
                target = target.rpartition(".")[0]
            a, b = package_of(name), package_of(target) if target else ""
            if target and a != b:
                edges.setdefault((a, b), set()).add(f"{name} -> {target}")
    return edges


def test_no_module_is_past_the_line_limit():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}


def module_graph() -> dict[str, set[str]]:
    """module -> the draftdata modules it imports, every import counted: module level, lazy
    (inside functions), under TYPE_CHECKING, and a package's __init__ importing its submodules.
    A name imported from a module is that module."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for target in all_imports(name, path):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def test_no_import_cycles():
    """The module-level import graph, counting every import, has no cycle."""
    graph = module_graph()
    cycles = []
    state: dict[str, int] = {}

    def dfs(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(" -> ".join([*stack[stack.index(m) :], m]))
            elif m not in state:
                dfs(m, [*stack, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            dfs(n, [n])
    assert cycles == []


def test_every_package_is_on_exactly_one_level():
    placed = [p for level in LEVELS for p in level]
    assert len(placed) == len(set(placed))
    assert {package_of(n) for n in modules()} == set(placed)


def test_package_imports_run_down_the_levels_and_never_in_a_cycle():
    """Every import counts, lazy ones and registration included: a package imports only
    packages on a lower level of ``LEVELS``, so the package graph has no cycle."""
    level = {p: i for i, names in enumerate(LEVELS) for p in names}
    edges = package_edges()
    up = [
        f"{a} (level {level.get(a, '?')}) -> {b} (level {level.get(b, '?')}): "
        f"{'; '.join(sorted(why))}"
        for (a, b), why in sorted(edges.items())
        if level.get(b, -1) >= level.get(a, -1)
    ]
    assert up == []
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    cycles: list[str] = []
    state: dict[str, int] = {}

    def dfs(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycle = [*stack[stack.index(m) :], m]
                cycles.append(
                    " -> ".join(cycle)
                    + ": "
                    + "; ".join(min(edges[a, b]) for a, b in itertools.pairwise(cycle))
                )
            elif m not in state:
                dfs(m, [*stack, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            dfs(n, [n])
    assert cycles == []


def test_every_class_a_lower_table_names_exists():
    """The tables below the code they name (config.BACKENDS, export.trainers.TRAINERS' layouts)
    name it as "module:Class" strings, so an import does not run up; each must resolve."""
    from importlib import import_module

    from draftdata.config import BACKENDS
    from draftdata.export.trainers import LAYOUTS

    named = [b.implementation for b in BACKENDS.values()]
    named += [t.layout for t in LAYOUTS.values() if t.layout is not None]
    missing = []
    for spec in named:
        module, _, attr = spec.partition(":")
        if not isinstance(getattr(import_module(module), attr, None), type):
            missing.append(spec)
    assert missing == []


def test_sql_only_in_the_store_and_the_core_stays_pure():
    offenders = []
    for name, path in modules().items():
        imported = {m.split(".")[0] for m in top_level_imports(name, path)}
        src = path.read_text()
        local = {
            n.names[0].name.split(".")[0]
            if isinstance(n, ast.Import)
            else (n.module or "").split(".")[0]
            for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.Import, ast.ImportFrom)) and not getattr(n, "level", 0)
        }
        if "sqlite3" in imported | local and not name.startswith("draftdata.store"):
            offenders.append(f"{name} imports sqlite3")
        stage = name.split(".")[1] if name.count(".") else ""
        if stage in PURE:
            bad = (imported | local) & set(IMPURE)
            if bad:
                offenders.append(f"{name} (pure core) imports {sorted(bad)}")
    assert offenders == []


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((name, node))
    return out


def test_the_target_travels_whole():
    """The target as one value (``tokens.target.Target``): no function below the CLI takes its
    parts beside each other (a bound format beside the split preferences, the thinking option
    or the prompt options), one place makes the encoder from segments to ids, and no function
    is past 80 lines."""
    parts = {"text_ids", "prefs", "thinking", "prompt_opts", "prompt_options"}
    beside, long = [], []
    for name, fn in _functions():
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        names = {a.arg for a in args}
        annotated = {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in args}
        bound = any(a == "bound" or "BoundFormat" in annotated[a] for a in names)
        if bound and names & parts and not name.startswith("draftdata.cli"):
            beside.append(f"{name}.{fn.name}: {sorted(names & parts)}")
        if fn.end_lineno is not None and fn.end_lineno - fn.lineno + 1 > 80:
            long.append(f"{name}.{fn.name}: {fn.end_lineno - fn.lineno + 1} lines")
    assert beside == []
    assert long == []
    made = [
        f"{name}:{node.lineno}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("PieceEncoder")
    ]
    assert made == [made[0]] and made[0].startswith("draftdata.tokens.encoding:")
    text_ids = sum(p.read_text().count("text_ids") for p in modules().values())
    assert text_ids < 20
