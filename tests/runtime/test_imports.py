"""What a task process imports (issue 28: a job's fixed cost): not the connectors its job does
not use, not the terminal UI; every connector name still there when asked for.  And no import
cycle between cutline's modules at import time (issue 26)."""

import ast
import subprocess
import sys
from pathlib import Path

import cutline.connectors


def test_a_task_process_imports_neither_rich_nor_unused_connectors():
    code = ("import sys, cutline.driver.run, cutline.runtime.task, cutline.connectors.files, "
            "cutline.connectors.discard\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m in ("
            "'cutline.connectors.kafka', 'cutline.connectors.kafka_sink', "
            "'cutline.connectors.delta', 'cutline.connectors.upsert')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "[]"


def test_every_connector_name_resolves_to_its_class():
    import importlib

    for name in cutline.connectors.__all__:
        value = getattr(cutline.connectors, name)
        assert value.__name__ == name
        assert name in dir(cutline.connectors)
    fs = importlib.import_module("cutline.connectors.files").FileSource
    from cutline.connectors import FileSource
    assert FileSource is fs


def test_an_unknown_connector_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'NoSuchSink'"):
        cutline.connectors.NoSuchSink  # noqa: B018
    with pytest.raises(ImportError):
        from cutline.connectors import NoSuchSink  # noqa: F401


def test_the_errors_users_catch_are_exported_from_cutline():
    """``from cutline import JobFailed`` (issue 29: an ImportError; it lived in
    cutline.driver.dataflow only), each the class the run raises."""
    import cutline
    from cutline import (  # noqa: F401 - the import users write
        CheckpointStorageError,
        FinishedJobError,
        IncompatibleCheckpointError,
        JobAlreadyRunningError,
        JobCancelled,
        JobFailed,
        SavepointError,
    )
    from cutline.driver.dataflow import JobFailed as defined
    from cutline.driver.run import JobCancelled as cancelled
    from cutline.storage.lease import JobAlreadyRunningError as refused

    assert JobFailed is defined and JobCancelled is cancelled
    assert JobAlreadyRunningError is refused
    assert issubclass(FinishedJobError, JobFailed) and issubclass(JobCancelled, JobFailed)
    assert issubclass(JobAlreadyRunningError, CheckpointStorageError)
    for name in ("JobFailed", "FinishedJobError", "JobAlreadyRunningError",
                 "IncompatibleCheckpointError", "JobCancelled", "SavepointError",
                 "CheckpointStorageError"):
        assert name in cutline.__all__ and name in dir(cutline)
        assert getattr(cutline, name).__name__ == name
    # ``import cutline`` stays light: the driver loads when an error is asked for
    code = ("import sys, cutline; assert not [m for m in sys.modules if m.startswith("
            "('cutline.driver', 'cutline.storage', 'cutline.runtime'))], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------ import cycles (issue 26)


def _module_imports(tree: ast.Module, package: str) -> set[str]:
    """What a module imports when it is imported: its top-level imports (those in ``if``,
    ``try`` and ``with`` blocks too, not under ``if TYPE_CHECKING:``), not the ones inside a
    function (the lazy ones: ``Pipeline.run``'s engine, a connector's pyarrow half)."""
    found: set[str] = set()

    def walk(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.Import):
                found.update(a.name for a in s.names)
            elif isinstance(s, ast.ImportFrom):
                if s.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - s.level + 1] + [s.module or ""])
                else:
                    base = s.module or ""
                base = base.rstrip(".")
                found.add(base)
                found.update(f"{base}.{a.name}" for a in s.names)
            elif isinstance(s, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(s.test):
                    walk(s.body)
                walk(s.orelse)
            elif isinstance(s, ast.Try):
                walk(s.body)
                walk(s.orelse)
                walk(s.finalbody)
                for h in s.handlers:
                    walk(h.body)
            elif isinstance(s, ast.With):
                walk(s.body)

    walk(tree.body)
    return found


def module_import_graph(src: Path) -> dict[str, set[str]]:
    """cutline's modules -> the modules of cutline each imports at import time (a module
    ``a.b.c`` imports ``a.b`` too, unless it is inside it: a package's ``__init__`` runs
    before its modules anyway)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in (src / "cutline").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        pkg = name if package else name.rpartition(".")[0]
        edges: set[str] = set()
        for target in _module_imports(ast.parse(path.read_text()), pkg):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                m = ".".join(parts[:i])
                if m in modules and m != name and not name.startswith(m + "."):
                    edges.add(m)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_module_imports_itself_round_a_cycle():
    """No import circle at import time between cutline's modules: importing any of them
    never depends on which was imported first.  A cycle a lazy import closes (the
    documented ``run()`` entry points into the engine) is not one; lint-imports' contracts
    (pyproject.toml) keep the packages' layers."""
    src = Path(cutline.__file__).resolve().parents[1]
    graph = module_import_graph(src)
    assert len(graph) > 100 and "cutline.logical" in graph["cutline.api.streams"]
    assert "cutline.spark.launcher" not in graph["cutline.api.pipeline"]  # (a lazy import)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(import_cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]
    tree = ast.parse("import x.y\nfrom . import z\nfrom ..p import q\nif TYPE_CHECKING:\n"
                     "    import no\ntry:\n    import t\nexcept ImportError:\n    pass\n"
                     "def f():\n    import lazy\n")
    assert _module_imports(tree, "cutline.api") == {
        "x.y", "cutline.api", "cutline.api.z", "cutline.p", "cutline.p.q", "t"}
