"""The package's shape, read from its source: no import circle, one
responsibility per module (its docstring's first line), the drivers never
import a repair, and SGLang's private names touched in the adapter only."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "sglang_dspark_dp"
TOP = "sglang_dspark_dp"

#: The adapter package: the one place that spells SGLang's private names.
ADAPTER = f"{TOP}.adapter"
#: A private name: one leading underscore (dunder names are not private).
PRIVATE_NAME = re.compile(r"(?<!\w)_[A-Za-z]\w*")
#: Private names of other libraries the plugin may spell, and whose.
NOT_SGLANG = {
    "_SubParsersAction": "argparse",
    "_exit": "os",
    "_version": "torch.Tensor (its version counter)",
    "_C": "torch (its C extension)",
    "_distributed_c10d": "torch._C (c10d, where the flight recorder lives)",
    "_dump_fr_trace": "torch._C._distributed_c10d (the flight recorder's dump)",
}
#: The plugin's own attributes on SGLang objects carry this prefix.
OWN_PREFIX = "_sglang_dspark_dp"


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


def in_adapter(name: str) -> bool:
    return name == ADAPTER or name.startswith(f"{ADAPTER}.")


def code_strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of ``tree`` but the docstrings (prose may name
    what it describes), f-strings' literal parts included."""
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docs.add(id(body[0].value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
        if id(n) not in docs
    ]


def on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def private_spellings(tree: ast.AST):
    """``(line, name, how)`` for every private name ``tree``'s code spells:
    as an attribute (``how``: "attribute", or "own attribute" on ``self`` or
    ``cls``), inside a string, as a definition, or imported from SGLang."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and PRIVATE_NAME.fullmatch(node.attr):
            how = "own attribute" if on_self(node) else "attribute"
            yield node.lineno, node.attr, how
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if PRIVATE_NAME.fullmatch(node.name):
                yield node.lineno, node.name, "definition"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sglang."
        ):
            for alias in node.names:
                for name in PRIVATE_NAME.findall(f"{node.module}.{alias.name}"):
                    yield node.lineno, name, "import"
    for node in code_strings(tree):
        for name in PRIVATE_NAME.findall(node.value):
            yield node.lineno, name, "string"


def adapter_names() -> set[str]:
    """SGLang's private names, as the adapter spells them: in its strings
    (attribute names, hook targets, dotted paths) and as attributes of
    anything but the adapter's own objects."""
    names = set()
    for name, path in modules().items():
        if in_adapter(name):
            for _line, found, how in private_spellings(ast.parse(path.read_text())):
                if how in ("string", "attribute", "import"):
                    names.add(found)
    return names


def own_names() -> set[str]:
    """The private names the plugin defines for itself: its functions,
    classes, variables, arguments and its objects' attributes."""
    own = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.Attribute) and on_self(node):
                if isinstance(node.ctx, ast.Store):
                    own.add(node.attr)
    return own


def private_offenders(mods: dict[str, Path]) -> list[str]:
    """Where a module outside the adapter spells a private name of SGLang's:
    one the adapter spells (in any form, even as an attribute of ``self``,
    as a stand-in does), one imported from SGLang, or one the plugin does
    not define for itself and that is no other library's (in a string or as
    an attribute)."""
    sglang = adapter_names()
    own = own_names() - sglang
    offenders = []
    for name, path in mods.items():
        if in_adapter(name):
            continue
        for line, found, how in private_spellings(ast.parse(path.read_text())):
            if found in sglang:
                why = "SGLang's (the adapter spells it)"
            elif how == "import":
                why = "SGLang's (imported from it)"
            elif how in ("own attribute", "definition") or found in own:
                continue
            elif found in NOT_SGLANG or found.startswith(OWN_PREFIX):
                continue
            else:
                why = "not the plugin's own (if it is SGLang's: the adapter)"
            offenders.append((name, line, f"{name}:{line}: {found} ({how}): {why}"))
    return [text for *_where, text in sorted(offenders)]


def test_the_adapter_names_are_found_in_each_form():
    """The check below knows SGLang's names from the adapter: one from a
    string constant, one from a dotted hook target, one from an attribute."""
    names = adapter_names()
    assert {"_tp_sync", "_update_gather_batch", "_hooks"} <= names, names
    assert not {"_saved", "_swaps"} & names  # the adapter's own attributes


def test_sglang_private_names_live_in_the_adapter_only():
    offenders = private_offenders(modules())
    assert not offenders, "\n".join(offenders)


def test_the_private_name_check_catches_each_form(tmp_path):
    """A module outside the adapter that spells an SGLang-private name in
    any form is named: a string lookup, a dotted path, an attribute, a
    stand-in's attribute on ``self``, an import, and a name nothing in the
    plugin defines."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        textwrap.dedent(
            """\
            from sglang.srt.utils import _private_helper
            def f(worker, group):
                a = vars(worker).get("_tp_sync")
                b = getattr(worker, "_hosts_draft", None)
                c = f"{group}._update_gather_batch"
                d = worker._dp_moe_sync
                e = getattr(worker, "_brand_new_private")
                return a, b, c, d, e
            class StandIn:
                def __init__(self):
                    self._draft_worker = None
            """
        )
    )
    found = private_offenders({f"{TOP}.drivers.bad": bad})
    names = [line.split(": ")[1].split(" ")[0] for line in found]
    assert names == [
        "_private_helper",
        "_tp_sync",
        "_hosts_draft",
        "_update_gather_batch",
        "_dp_moe_sync",
        "_brand_new_private",
        "_draft_worker",
    ], found
    docs = tmp_path / "docs.py"
    docs.write_text('"""Prose may name ``_tp_sync``."""\n')
    assert private_offenders({f"{TOP}.drivers.docs": docs}) == []


def test_the_package_summary_names_every_repair():
    import tomllib

    from sglang_dspark_dp import registry

    project = tomllib.loads((PKG.parents[1] / "pyproject.toml").read_text())["project"]
    missing = [n for n in registry.names() if n not in project["description"]]
    assert not missing, project["description"]
