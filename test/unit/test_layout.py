"""The package's shape, read from its source: no import circle, one
responsibility per module (its docstring's first line), the drivers never
import a repair, and SGLang's private names touched in the adapter only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "sglang_dspark_dp"
TOP = "sglang_dspark_dp"

#: SGLang-private names the plugin uses; only the adapter package spells them.
PRIVATE = (
    "_hooks",
    "_patched",
    "_draft_block_spec_info",
    "_dp_moe_sync",
    "_run_forward",
    "_update_gather_batch",
    "_parallel_fields",
    "_generate_decode_cuda_graph_batch_sizes",
    "_budget_from_resolved",
    "_tp_sync",
    "_tp_group",
)


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[: len(up) - node.level + 1] + [base]).strip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def test_no_import_circle():
    mods = modules()
    graph = {n: imports_of(n, p, set(mods)) for n, p in mods.items()}
    # A package's __init__ importing its own submodules is not a circle.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if n.startswith(m + "."):  # a module importing its own package
                continue
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join([*stack, m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n)
    assert len(graph) > 10  # the walk saw the package


def test_the_drivers_never_import_a_repair():
    mods = modules()
    for name, path in mods.items():
        if name.startswith(f"{TOP}.drivers"):
            bad = {
                m
                for m in imports_of(name, path, set(mods))
                if m.startswith(f"{TOP}.srt.speculative") or m == f"{TOP}.registry"
            }
            assert not bad, f"{name} imports {bad}"


def test_every_module_names_its_one_responsibility():
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.splitlines()[0].strip(), f"{name} has no docstring"


def test_sglang_private_names_live_in_the_adapter_only():
    pattern = re.compile(r"\.(" + "|".join(PRIVATE) + r")\b")
    offenders = []
    for name, path in modules().items():
        if name == f"{TOP}.adapter" or name.startswith(f"{TOP}.adapter."):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.name}:{i}: {line.strip()}")
    assert not offenders, offenders


def test_the_package_summary_names_every_repair():
    import tomllib

    from sglang_dspark_dp import registry

    project = tomllib.loads((PKG.parents[1] / "pyproject.toml").read_text())["project"]
    missing = [n for n in registry.names() if n not in project["description"]]
    assert not missing, project["description"]
