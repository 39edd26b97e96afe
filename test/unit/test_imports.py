"""Post-import hooks (``sglang_dspark_dp.imports``) on throwaway packages
written to a temporary folder: a callback runs after its module's first
import, never in a process that does not import it, and only once the import
chain that brought the module in has settled. Each case runs in a fresh
interpreter, so no finder or module outlives it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: A package ``chain``: ``outer`` imports ``inner`` at its top, then defines
#: ``READY``; a callback on ``inner`` that reads ``outer.READY`` only works
#: once the chain has settled. ``broken`` fails on its first import only.
FILES = {
    "chain/__init__.py": "",
    "chain/inner.py": "VALUE = 1\n",
    "chain/outer.py": "from chain import inner\nimport chain.deep\nREADY = True\n",
    "chain/deep.py": "from chain import leaf\n",
    "chain/leaf.py": "LEAF = 2\n",
    "chain/broken.py": (
        "import os\n"
        "if not os.path.exists(os.environ['FLAG']):\n"
        "    open(os.environ['FLAG'], 'w').close()\n"
        "    raise RuntimeError('first import fails')\n"
    ),
    "other/__init__.py": "",
    "other/mod.py": "X = 3\n",
}

PRELUDE = """
import sys
from sglang_dspark_dp import imports
seen = []
def note(tag):
    def callback(module):
        import chain.outer as outer_now
        seen.append((tag, module.__name__, getattr(outer_now, "READY", None)))
    return callback
"""


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def run(tree: Path, body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    env = {"PYTHONPATH": str(tree), "FLAG": str(tree / "flag"), "PATH": "/usr/bin"}
    import os

    env["PYTHONPATH"] += os.pathsep + os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_callback_waits_for_the_chain_that_imports_its_module(tree):
    out = run(
        tree,
        """
        imports.when_imported("chain.inner", note("inner"))
        imports.when_imported("chain.leaf", note("leaf"))
        print("before", seen)
        import chain.outer
        print("after", seen)
        """,
    )
    before, after = out.splitlines()
    assert before == "before []"
    # Both ran after chain.outer had finished (READY set), inner first.
    assert after == (
        "after [('inner', 'chain.inner', True), ('leaf', 'chain.leaf', True)]"
    )


def test_an_imported_module_runs_its_callback_at_once(tree):
    out = run(
        tree,
        """
        import chain.outer
        imports.when_imported("chain.inner", note("inner"))
        print(seen, imports.waiting())
        """,
    )
    assert out == "[('inner', 'chain.inner', True)] []"


def test_a_module_never_imported_runs_nothing_and_its_neighbours_load_as_usual(
    tree,
):
    out = run(
        tree,
        """
        imports.when_imported("chain.inner", note("inner"))
        import other.mod
        print(seen, imports.waiting(), other.mod.X, "chain.inner" in sys.modules)
        """,
    )
    assert out == "[] ['chain.inner'] 3 False"


def test_a_failed_import_runs_nothing_and_the_next_success_does(tree):
    out = run(
        tree,
        """
        def broken(module):
            seen.append(module.__name__)
        imports.when_imported("chain.broken", broken)
        try:
            import chain.broken
        except RuntimeError:
            print("failed", seen)
        import chain.broken
        print("ok", seen)
        """,
    )
    assert out.splitlines() == ["failed []", "ok ['chain.broken']"]


def test_a_failing_callback_never_breaks_the_import(tree):
    out = run(
        tree,
        """
        def bad(module):
            raise ValueError("boom")
        imports.when_imported("chain.inner", bad)
        imports.when_imported("chain.inner", note("inner"))
        import chain.inner
        print(chain.inner.VALUE, seen)
        """,
    )
    assert out == "1 [('inner', 'chain.inner', True)]"


def test_a_chained_module_keeps_its_loader_type(tree):
    out = run(
        tree,
        """
        imports.when_imported("chain.inner", note("inner"))
        import importlib.machinery, inspect
        import chain.inner
        print(type(chain.inner.__loader__).__name__, inspect.getsource(chain.inner).strip())
        """,
    )
    assert out == "SourceFileLoader VALUE = 1"


def test_discard_forgets_what_waits(tree):
    out = run(
        tree,
        """
        imports.when_imported("chain.inner", note("inner"))
        imports.discard()
        import chain.outer
        print(seen, imports.waiting())
        """,
    )
    assert out == "[] []"
