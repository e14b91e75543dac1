"""The layout is the architecture: imports point down, no circles, no private names across modules,
a pure core without module-level state, and files small enough to read.

Every module's imports are read with ``ast`` (function-level and ``TYPE_CHECKING`` ones included:
an import hidden in a function is still a dependency).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Layers, bottom first: a package may import its own modules and packages of a LOWER rank only.
# (docs/design.md draws it.)
RANK = {
    "curves": 0,  # throughput_at: how every layer reads a curve
    "hostlist": 0,  # Slurm host lists: read by the Slurm backend and the trace readers
    "authframe": 0,  # authenticated frames: the agent channel and the workers' store channel
    "contract": 1,  # what the daemon side and the worker side agree on (env names, exit codes, formats)
    "spawner": 0,  # a worker's K processes on a node: the node agent's and the rank agent's one spawner
    "allocator": 1,
    "profiler": 1,
    "policy": 2,
    "traces": 2,  # readers of logs: plain data
    "scavenger": 3,  # backends (the local one replays a trace's idle timeline)
    "simulator": 4,
    "evaluation": 5,  # many replays, the evaluation and its reports, above the replay engine
    "malletrain": 6,  # the daemon, the worker side, the CLI (it fronts the evaluation and the simulator)
}
# Test support, not product: it may import any product package, and no product package imports it.
TEST_SUPPORT = ("tests",)  # tests/clusters: the Slurm and PBS test clusters, a fake Slurm, floods
TEST_SUPPORT_DIRS = ("tests/clusters",)
BOTTOM = ("curves", "hostlist", "authframe", "spawner")  # libraries every side may use
# malletrain's packages by process: what each may import of the project besides the layers below it.
WORKER = "malletrain.worker"  # what runs inside a user's job
DAEMON_SIDE = ("malletrain.daemon", "malletrain.runtimes")  # what only the head node runs
CLI = "malletrain.cli"  # the command, on top
FLAT_MAX_LINES = 1000  # malletrain's flat modules (beside its packages), together
PURE = ("curves", "hostlist", "allocator", "profiler", "policy")
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in (*RANK, *TEST_SUPPORT_DIRS) for p in sorted((REPO / pkg).rglob("*.py"))}


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(module imported, name imported from it or None, line)`` for every import in ``module``."""
    path = MODULES[module]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (base, alias.name, node.lineno))
    return out


def project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for target, _, _ in imports(module):
            if target in MODULES:
                edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(set(edges).union(*edges.values())):
        if v not in index:
            visit(v)
    return found


def test_the_analysis_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    # the walk covers every node, so an import inside a function or an `if TYPE_CHECKING:` counts
    assert any(t == "traces.model" for t, _, _ in imports("scavenger.local"))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for module in MODULES:
        own = module.split(".")[0]
        for target, _, line in imports(module):
            top = target.split(".")[0]
            if own in TEST_SUPPORT:
                continue
            if top in TEST_SUPPORT:
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {target} (test support, not product)")
            elif top in RANK and top != own and RANK[top] >= RANK[own]:
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {target} ({own} may not)")
    assert wrong == []


def test_the_test_clusters_are_test_support_and_no_product_package_imports_them() -> None:
    assert "tests.clusters.slurm_cluster" in MODULES and "tests.clusters.common" in MODULES
    assert not any(m.startswith(("scavenger.testing", "testclusters")) for m in MODULES)  # out of the product
    users = sorted({m for m in MODULES if m.split(".")[0] in RANK
                    for target, _, _ in imports(m) if target.split(".")[0] in TEST_SUPPORT})
    assert users == []


def test_the_installed_packages_are_the_products() -> None:
    """pyproject.toml installs the packages of the table and nothing else (no test support)."""
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(name.rstrip("*") for name in include) == sorted(RANK)


PER_PACKAGE = [*RANK, *TEST_SUPPORT]


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def worker_findings(modules: list[str], imports_of) -> list[str]:
    """Imports of the worker side that leave it: anything of the project but the worker itself, the
    contract and the bottom libraries (the daemon, the runtimes, the CLI, the node agent's internals)."""
    allowed = (WORKER, "contract", *BOTTOM)
    return [f"{m}:{line} imports {target}" for m in modules if in_package(m, WORKER)
            for target, _, line in imports_of(m)
            if target.split(".")[0] in RANK and not any(in_package(target, a) for a in allowed)]


def contract_findings(modules: list[str], imports_of) -> list[str]:
    """Imports of the contract beyond the standard library and the bottom libraries (or itself)."""
    allowed = ("contract", *BOTTOM)
    return [f"{m}:{line} imports {target}" for m in modules if in_package(m, "contract")
            for target, _, line in imports_of(m)
            if not any(in_package(target, a) for a in allowed) and not is_stdlib(target)]


def daemon_side_findings(modules: list[str], imports_of) -> list[str]:
    """Imports of the head node's code (the daemon, the runtimes) from the worker side or the CLI."""
    return [f"{m}:{line} imports {target}" for m in modules if any(in_package(m, d) for d in DAEMON_SIDE)
            for target, _, line in imports_of(m) if in_package(target, WORKER) or in_package(target, CLI)]


def agent_findings(modules: list[str], imports_of) -> list[str]:
    """Imports of malletrain by the node agent's package (the scavenger)."""
    return [f"{m}:{line} imports {target}" for m in modules if in_package(m, "scavenger")
            for target, _, line in imports_of(m) if in_package(target, "malletrain")]


def is_stdlib(module: str) -> bool:
    import sys
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


def test_the_side_rules_can_fail() -> None:
    graph = {"malletrain.worker.a": [("malletrain.daemon.store", None, 3), ("contract.exits", None, 4),
                                     ("scavenger.agent_workers", None, 5), ("torch", None, 6)],
             "contract.b": [("os", None, 1), ("numpy", None, 2), ("malletrain.worker.a", None, 3)],
             "malletrain.runtimes.c": [("malletrain.worker.client", None, 7), ("malletrain.daemon.store", None, 8)],
             "scavenger.d": [("malletrain.worker.launch", None, 9), ("contract.exits", None, 10)]}
    assert worker_findings(list(graph), lambda m: graph[m]) == [
        "malletrain.worker.a:3 imports malletrain.daemon.store", "malletrain.worker.a:5 imports scavenger.agent_workers"]
    assert contract_findings(list(graph), lambda m: graph[m]) == [
        "contract.b:2 imports numpy", "contract.b:3 imports malletrain.worker.a"]
    assert daemon_side_findings(list(graph), lambda m: graph[m]) == ["malletrain.runtimes.c:7 imports malletrain.worker.client"]
    assert agent_findings(list(graph), lambda m: graph[m]) == ["scavenger.d:9 imports malletrain.worker.launch"]
    assert oversized({"a": 30, "b": 5, "c": 5}) == {"a": 30} and oversized({"a": 10, "b": 10, "c": 10, "d": 10}) == {}


def test_worker_code_imports_no_daemon_cli_or_agent_internals() -> None:
    """What runs inside a user's job imports the contract (and the bottom libraries), never the daemon,
    its runtimes, the CLI or the node agent's internals: shared code moves down, into the contract."""
    assert "malletrain.worker.torchrun_agent" in MODULES and "malletrain.worker.elastic.state" in MODULES
    assert worker_findings(list(MODULES), imports) == []


def test_the_contract_imports_only_the_standard_library_and_the_bottom_libraries() -> None:
    assert "contract.workerenv" in MODULES and "contract.exits" in MODULES
    assert contract_findings(list(MODULES), imports) == []


def test_the_daemon_side_imports_neither_the_worker_side_nor_the_cli() -> None:
    """The head node's code starts workers by command (a module's name), never by importing them."""
    assert daemon_side_findings(list(MODULES), imports) == []


def test_the_node_agent_never_imports_malletrain() -> None:
    assert agent_findings(list(MODULES), imports) == []


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def package_sizes() -> dict[str, int]:
    """Lines of each package of the product: a top-level package whole, but malletrain's subpackages
    counted apart and its flat modules (beside them) as one unit, ``malletrain/*.py``."""
    sizes: dict[str, int] = defaultdict(int)
    for module, path in MODULES.items():
        rel = path.relative_to(REPO).parts
        if rel[0] in TEST_SUPPORT:
            continue
        if rel[0] == "malletrain":
            unit = "malletrain/*.py" if len(rel) == 2 else f"malletrain/{rel[1]}"
        else:
            unit = rel[0]
        sizes[unit] += lines_of(path)
    return dict(sizes)


def test_malletrains_flat_modules_are_few() -> None:
    """malletrain/ holds its packages by process; beside them only a few small modules (at most 1,000
    lines together): the package's face and its ``__main__``."""
    flat = package_sizes()["malletrain/*.py"]
    assert flat <= FLAT_MAX_LINES, f"malletrain's flat modules hold {flat} lines"


def oversized(sizes: dict[str, int]) -> dict[str, int]:
    """The packages over a quarter of all the lines."""
    total = sum(sizes.values())
    return {unit: n for unit, n in sizes.items() if n > total / 4}


def test_no_package_holds_more_than_a_quarter_of_the_product() -> None:
    sizes = package_sizes()
    assert oversized(sizes) == {}, f"over a quarter of {sum(sizes.values())} lines"


WORKER_SIDE = ("malletrain.worker.elastic", "malletrain.worker.torchrun_agent", "malletrain.worker.warm_ranks",
               "malletrain.worker.launch", "malletrain.worker.client", "contract.workerenv", "malletrain.worker.integrations")
"""What runs inside a user's job (the rank agent and its rank servers included)."""


def test_worker_side_code_imports_nothing_of_the_scavenger() -> None:
    """The rank agent spawns its ranks with the node agent's code, which lives below both (:mod:`spawner`):
    the worker side imports no internal of the node agent (``scavenger``)."""
    worker = [m for m in MODULES if m.startswith(WORKER_SIDE)]
    assert "malletrain.worker.torchrun_agent" in worker and "malletrain.worker.warm_ranks" in worker
    bad = [f"{MODULES[m].relative_to(REPO)}:{line} imports {target}" for m in worker
           for target, _, line in imports(m) if target.split(".")[0] == "scavenger"]
    assert bad == []


@pytest.mark.parametrize("package", PER_PACKAGE)
def test_no_import_circle(package: str) -> None:
    found = [c for c in circles(project_edges()) if any(m.split(".")[0] == package for m in c)]
    assert found == []


@pytest.mark.parametrize("package", PER_PACKAGE)
def test_no_private_name_is_imported_from_another_module(package: str) -> None:
    wrong = []
    for module in [m for m in MODULES if m.split(".")[0] == package]:
        for target, name, line in imports(module):
            if name is not None and name.startswith("_") and not name.startswith("__") and target != module:
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {name} from {target}")
    assert wrong == []


def _mutable(value: ast.expr) -> bool:
    while isinstance(value, ast.Subscript):  # a slice or view of a mutable thing is one too
        value = value.value
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)) and \
        (value.func.id if isinstance(value.func, ast.Name) else value.func.attr) in (
            "dict", "list", "set", "defaultdict", "deque", "OrderedDict", "Counter", "bytearray",
            "array", "asarray", "zeros", "ones", "full", "empty", "arange")  # numpy arrays are mutable too


def pure_core_findings(path: Path) -> list[str]:
    """Module-level mutable state, caching decorators, ``global``, ``__new__`` and ``id()`` in a file."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _mutable(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.append(f"{path.name}:{node.lineno} module-level mutable {ast.unparse(targets[0])}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                text = ast.unparse(deco)
                if "cache" in text:
                    out.append(f"{path.name}:{node.lineno} {node.name} keeps a module-level cache ({text})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out.append(f"{path.name}:{node.lineno} global {', '.join(node.names)}")
        if isinstance(node, ast.Attribute) and node.attr == "__new__":
            out.append(f"{path.name}:{node.lineno} calls __new__")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
            out.append(f"{path.name}:{node.lineno} keys something by id()")
    return out


def test_the_checks_of_the_pure_core_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import functools\nimport numpy as np\n_seen: dict = {}\nKEEP = []\n__all__ = ['x']\nOK = (1, 2)\n"
                   "_BOTH = np.arange(2)[:, None]\nROWS = np.zeros(3)\n"
                   "@functools.lru_cache\ndef f(x):\n    global KEEP\n"
                   "    return _seen.get(id(x)) or object.__new__(int)\n")
    found = sorted(f.split(" ", 1)[1] for f in pure_core_findings(bad))
    assert found == sorted([
        "module-level mutable _seen", "module-level mutable KEEP", "module-level mutable __all__",
        "module-level mutable _BOTH", "module-level mutable ROWS", "f keeps a module-level cache (functools.lru_cache)", "global KEEP", "keys something by id()",
        "calls __new__"])


@pytest.mark.parametrize("package", PURE)
def test_the_pure_core_holds_no_module_level_state_and_no_identity_caches(package: str) -> None:
    found = [f for p in sorted((REPO / package).rglob("*.py")) for f in pure_core_findings(p)]
    assert found == []


@pytest.mark.parametrize("package", ["allocator", "profiler"])
def test_the_pure_core_writes_no_field_of_a_frozen_object(package: str) -> None:
    found = [f"{p.name}:{k}" for p in sorted((REPO / package).rglob("*.py"))
             for k, line in enumerate(p.read_text().splitlines(), 1) if "object.__setattr__" in line]
    assert found == []


def test_the_simulator_bypasses_no_constructor() -> None:
    found = [f for pkg in ("simulator", "evaluation") for p in sorted((REPO / pkg).rglob("*.py")) for f in pure_core_findings(p)
             if "__new__" in f or "id()" in f]
    assert found == []


def source_files() -> list[Path]:
    """The code and the hand-written pages (``malletrain evaluate``'s reports under docs/evaluation are output)."""
    skip = {"tests", ".git", ".venv", "build", "dist", "site"}
    files = [*REPO.rglob("*.py"), *REPO.rglob("*.md")]
    return [p for p in sorted(files) if not skip.intersection(p.relative_to(REPO).parts)
            and not p.relative_to(REPO).as_posix().startswith("docs/evaluation/")]


def test_no_file_outside_tests_is_over_600_lines() -> None:
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in source_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []
    assert REPO / "docs" / "operators.md" in source_files()  # the pages count too
