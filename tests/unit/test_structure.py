"""The package's shape, read from its imports and calls (no JVM, no run): three layers importing
one way, no import circle, assets that never import the IO manager, and Delta commits only in the
write module and the state store."""

import ast
from pathlib import Path

import pytest

import incremental_assets

PACKAGE = Path(incremental_assets.__file__).parent
ROOT = PACKAGE.name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


def imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The project's modules a module imports, at any depth of its code (a `from package import
    module` names the module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == ROOT:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found.update(named or {node.module})
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    trees = sources()
    return {name: imports(tree, set(trees)) for name, tree in trees.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_finds_a_loop_and_only_a_loop():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle(graph):
    assert circles(graph) == []


def _under(name: str, *packages: str) -> bool:
    return any(name == f"{ROOT}.{p}" or name.startswith(f"{ROOT}.{p}.") for p in packages)


def test_lib_imports_neither_defs_nor_the_cli_nor_the_definitions(graph):
    wrong = {name: sorted(i for i in imported if _under(i, "defs", "cli", "definitions"))
             for name, imported in graph.items() if _under(name, "lib")}
    assert {name: found for name, found in wrong.items() if found} == {}


# Below a package, what it may not import: lib/incremental -> lib/state -> lib/delta, one way.
BELOW = {
    "lib.delta": ("lib.state", "lib.incremental", "lib.transforms", "lib.upkeep", "lib.source"),
    "lib.state": ("lib.incremental", "lib.transforms", "lib.upkeep"),
    "lib.source": ("lib.state", "lib.incremental", "lib.transforms", "lib.upkeep"),
    "lib.incremental": ("lib.transforms", "lib.upkeep"),
    "lib.transforms": ("lib.state", "lib.upkeep"),
}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_lib_packages_import_one_way(graph, package):
    wrong = {name: sorted(i for i in imported if _under(i, *BELOW[package]))
             for name, imported in graph.items() if _under(name, package)}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_no_asset_module_imports_the_io_manager(graph):
    """Assets and the IO manager agree through definition metadata (delta_table(...)) and the
    values they hand over; only the resources module builds the IO manager."""
    io_manager = f"{ROOT}.lib.delta.io_manager"
    importing = sorted(name for name, imported in graph.items()
                       if _under(name, "defs") and io_manager in imported and name != f"{ROOT}.defs.resources")
    assert importing == []


def test_the_io_manager_stores_and_decides_nothing():
    text = (PACKAGE / "lib" / "delta" / "io_manager.py").read_text()
    for decision in ("get_latest_materialization", "asset_materialization", "acquire", "save_entry", "save_days",
                     "entries(", "acquire(", "ahead"):
        assert decision not in text, decision


# Calls that commit to a Delta table (deltalake, delta-spark, Spark's writers), and SQL that does.
COMMIT_METHODS = {"merge", "mergeInto", "delete", "vacuum", "restore", "create_checkpoint", "cleanup_metadata", "save",
                  "saveAsTable", "insertInto", "writeTo", "set_table_properties"}
OPTIMIZE = {"compact", "z_order"}  # table.optimize.<this>(...)
DELTA_OPENERS = {"DeltaTable", "stored_table", "forPath", "forName"}  # `<opener>(...).update(...)` is a Delta UPDATE
NOT_DELTA = {("Definitions", "merge")}  # receivers whose method of that name commits nothing
COMMIT_SQL = ("MERGE", "DELETE", "UPDATE", "INSERT", "ALTER", "OPTIMIZE", "VACUUM", "CREATE", "REPLACE", "TRUNCATE")
COMMITTERS = {f"{ROOT}.lib.delta.write"}  # and every module of lib/state


def _opened_by(node: ast.AST) -> str | None:
    """The opener a receiver expression was called from (`stored_table(uri)`), if it is a call."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def commits(tree: ast.Module) -> list[str]:
    """Where a module commits to a Delta table, in line order: `line: call`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            if func.id == "write_deltalake":
                found.append((node.lineno, func.id))
            continue
        if not isinstance(func, ast.Attribute):
            continue
        name, receiver = func.attr, func.value
        receiver_name = receiver.id if isinstance(receiver, ast.Name) else None
        if name == "write_deltalake" or (name in COMMIT_METHODS and (receiver_name, name) not in NOT_DELTA):
            found.append((node.lineno, name))
        elif name in OPTIMIZE and isinstance(receiver, ast.Attribute) and receiver.attr == "optimize":
            found.append((node.lineno, f"optimize.{name}"))
        elif name == "update" and _opened_by(receiver) in DELTA_OPENERS:
            found.append((node.lineno, name))
        elif name == "sql" and node.args and isinstance(node.args[0], ast.Constant) and \
                str(node.args[0].value).lstrip().upper().startswith(COMMIT_SQL):
            found.append((node.lineno, name))
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_commits_finds_each_kind_of_delta_commit():
    code = ("deltalake.write_deltalake(u, t)\nDeltaTable(u).merge(s, p).execute()\nDefinitions.merge(a, b)\n"
            "df.write.format('delta').save(u)\nspark.sql('DELETE FROM t')\nspark.sql('SELECT 1')\n"
            "stored_table(u).update(p)\nvalues.setdefault(k, {}).update(more)\ntable.optimize.compact()\n"
            "compact(table, None)\nwrite_deltalake(u, t)\n")
    assert commits(ast.parse(code)) == [
        "1: write_deltalake", "2: merge", "4: save", "5: sql", "7: update", "9: optimize.compact", "11: write_deltalake",
    ]


def test_delta_commits_only_in_the_write_module_and_the_state_store():
    """One writer per table: every asset table through lib/delta/write.py (reached by the IO manager,
    the loader, a plan), the state tables through lib/state; nothing else commits."""
    committing = {name: calls for name, tree in sources().items() if (calls := commits(tree))}
    outside = {name: calls for name, calls in committing.items()
               if name not in COMMITTERS and not _under(name, "lib.state")}
    assert outside == {}, f"Delta commits outside lib/delta/write.py and lib/state/: {outside}"
    assert {f"{ROOT}.lib.delta.write", f"{ROOT}.lib.state.store"} <= set(committing), "the writers write"
