"""The package's shape, as docs/architecture.md's map draws it: imports go one way, ops →
models → runtime ← proposer / splitwise ← assembly ← serving ← entrypoints (no cycle between
modules, no exception to the map); no hand-written module over 400 lines and no function
over 80.

The imports are read from the source with ``ast`` (every ``import`` statement, at module
level or inside a function, under ``TYPE_CHECKING`` or not), so a lazy import that would
close a loop counts as much as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "fastdeploy_mtp"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: Written by the build (gitignored), not by hand.
GENERATED = {f"{PACKAGE}.ops._op_wrappers"}

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

#: Which layers a package may import. A module of a layer imports only its own layer and
#: the ones listed; the top-level modules named here are layers of their own.
ALLOWED: dict[str, set[str]] = {
    "ops": {"constants"},
    "constants": {"ops"},
    "config": set(),
    # the deployment's credentials (API key, splitwise secret, signatures) and refusal counts
    "credentials": set(),
    # the clients' keys (one per tenant), the metrics key, prefix-cache namespaces
    "tenancy": {"credentials"},
    "ipc": {"ops"},
    # confines a listener a library opened on every address to the loopback device
    "loopback_only": set(),
    "distributed": {"loopback_only"},
    "models": {"constants", "config", "ops", "distributed"},
    # the engine defines what it needs of a proposer and a hand-over (runtime.collaborators) and
    # imports neither; structured output (runtime.guided) reads the model folder's tokenizer
    "runtime": {"constants", "config", "ops", "ipc", "models", "distributed", "tokenization"},
    "proposer": {"constants", "config", "ops", "ipc", "models", "runtime", "distributed"},
    # the hand-over implements the engine's SlotHandover (and raises its HandoffError); the KV
    # layout reads a peer's caches as the model's cache spec (models.cache_spec) describes them
    "splitwise": {"constants", "config", "ops", "ipc", "credentials", "runtime", "models"},
    "tokenization": {"config"},
    # the draft-fidelity reference (transformers, where installed) reads model folders' configs
    "checks": {"config", "models"},
    # slots, KV blocks and batched tokens from memory, and the FDConfig they build
    "capacity": {"config", "models"},
    # engine_args refuses a K the token message (ops.messaging) cannot carry, on every command
    "engine_args": {"config", "constants", "ops", "models", "runtime", "tokenization", "capacity"},
    # builds the engine and the runner with the concrete proposers and splitwise hand-over
    "assembly": {"constants", "config", "ops", "ipc", "models", "runtime", "proposer"}
    | {"splitwise", "distributed"},
    # the server runs the engine (built by assembly), the proposer and the splitwise hand-over
    "serving": {"constants", "config", "ops", "ipc", "models", "runtime", "proposer", "splitwise"}
    | {"distributed", "engine_args", "tokenization", "credentials", "capacity", "assembly"}
    | {"tenancy"},
}
#: The commands sit on top: they may import every layer, and nothing imports them.
ALLOWED["entrypoints"] = set(ALLOWED) - {"entrypoints"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p for p in sorted(ROOT.rglob("*.py")) if _module_name(p) not in GENERATED
    }


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from pkg import mod`` names the module)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(name, path.name == "__init__.py", node)
                targets = [
                    f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target.startswith(PACKAGE) and target in modules and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted.
    A package's ``__init__`` re-exporting its own modules is not a loop of the code: edges
    from a package to the modules inside it are left out."""
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


GRAPH = _imports(_modules())


def test_the_graph_is_read():
    # guards the reader itself: a parse that found no edges would pass every check below
    assert f"{PACKAGE}.proposer.mtp" in GRAPH
    assert f"{PACKAGE}.config" in GRAPH[f"{PACKAGE}.proposer.mtp"]
    assert sum(len(d) for d in GRAPH.values()) > 100


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"p": {"p.x"}, "p.x": {"p"}}) == []  # a package and its own module


def test_imports_go_one_way():
    wrong = []
    for module, deps in GRAPH.items():
        layer = _layer(module)
        if layer == "":  # the package's __init__
            continue
        assert layer in ALLOWED, (
            f"{module}: layer {layer!r} is not on the map (add it to ALLOWED and the docs)"
        )
        for dep in deps:
            other = _layer(dep)
            if other and other != layer and other not in ALLOWED[layer]:
                wrong.append(f"{module} imports {dep}")
    assert wrong == []


def test_nothing_imports_the_entry_points():
    wrong = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if _layer(m) != "entrypoints"
        for d in deps
        if _layer(d) == "entrypoints"
    ]
    assert wrong == []


@pytest.mark.parametrize("module", sorted(_modules()))
def test_module_and_function_sizes(module):
    path = _modules()[module]
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT.parent)}: {lines} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], f"{path.relative_to(ROOT.parent)}"
