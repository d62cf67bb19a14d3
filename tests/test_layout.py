"""The house rules the layout promises, checked on the source itself: no module past 500 lines,
no import cycle between modules, SQL only in store/, no torch or HTTP client in the pure core."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

SRC = ROOT / "src" / "draftdata"
MAX_LINES = 500
#: the pure core imports no HTTP client, database or torch (DESIGN.md)
PURE = ("tokenizers", "formats", "tokens", "measure", "records")
IMPURE = ("sqlite3", "aiohttp", "httpx", "torch", "transformers", "starlette", "uvicorn")


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
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def test_no_module_is_past_the_line_limit():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}


def test_no_import_cycles():
    mods = modules()
    graph = {
        n: {m for m in top_level_imports(n, p) if m in mods and m != n} for n, p in mods.items()
    }
    cycles = []
    state: dict[str, int] = {}

    def dfs(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = [*stack[stack.index(m) :], m]
                # a package's __init__ importing its submodules to register them is not a cycle
                # between modules (the submodules import names the package defined first)
                pkg = min(cycle, key=len)
                if not all(c == pkg or c.startswith(pkg + ".") for c in cycle):
                    cycles.append(" -> ".join(cycle))
            elif m not in state:
                dfs(m, [*stack, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            dfs(n, [n])
    assert cycles == []


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
