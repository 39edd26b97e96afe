"""``scripts/mutants.py``: a mutant is judged by the whole suite of its
release. Its own tests first (the fast kill), then the rest of the suite;
a test of the rest that kills it must pass without it. Run here on a tiny
project of its own (real pytest runs, no SGLang), and its suite arguments
checked against ``noxfile.py``'s."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mutants():
    spec = importlib.util.spec_from_file_location(
        "mutants_script", ROOT / "scripts" / "mutants.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def noxfile_constant(name: str):
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


def test_the_rest_of_the_suite_is_the_release_session_s(mutants):
    assert mutants.BENCH_RELEASE == noxfile_constant("BENCH_RELEASE")
    assert tuple(mutants.SCRIPT_TESTS) == tuple(noxfile_constant("SCRIPT_TESTS"))
    listed = ["test/srt/test_a.py", "test/unit/test_b.py::test_c"]
    args = mutants.suite_args("0.5.16", listed)
    assert args[0] == "test"
    assert "--ignore=test/benchmark" in args and "--ignore=test/e2e" in args
    assert "--ignore=test/srt/test_a.py" in args
    assert "--deselect=test/unit/test_b.py::test_c" in args
    # The find-text check fails on any applied mutant: it never kills one.
    assert f"--deselect={mutants.TEXT_TEST}" in args
    assert mutants.TEXT_TEST.endswith(
        test_every_mutant_still_finds_its_text_once.__name__
    )
    bench = mutants.suite_args("0.5.17", listed)
    assert not any(a.startswith("--ignore=test/benchmark") for a in bench)
    assert not any(a.startswith("--ignore=test/e2e") for a in bench)


PROJECT = {
    "pkg.py": "def f():\n    return 1\n\ndef g():\n    return 1\n",
    # The mutant's own tests: they do not look at f's value.
    "test/test_own.py": "from pkg import f\n\ndef test_runs():\n    f()\n",
    # The rest of the suite: f's value, and nothing of g's.
    "test/test_rest.py": "from pkg import f\n\ndef test_value():\n    assert f() == 1\n",
    "test/e2e/test_script.py": "def test_gpu_script():\n    assert False\n",
    # A parametrized test whose id holds spaces, and g's value.
    "test/test_spaced.py": (
        "import pytest\nfrom pkg import g\n\n"
        "@pytest.mark.parametrize('says', ['g is one'])\n"
        "def test_g(says):\n    assert g() == 1\n"
    ),
}


@pytest.fixture
def project(tmp_path, mutants):
    for rel, text in PROJECT.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    return tmp_path, mutants.pytest_in(tmp_path, env)


def mutant(find, replace, tests=("test/test_own.py",)):
    return {"id": "m", "file": "pkg.py", "find": find, "replace": replace,
            "tests": list(tests)}  # fmt: skip


def test_a_mutant_its_own_tests_miss_is_killed_by_the_rest_of_the_suite(
    mutants, project
):
    work, run = project
    m = mutant("def f():\n    return 1", "def f():\n    return 2")
    outcome, by, _ = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert outcome == "killed"
    assert by == "the suite: test/test_rest.py::test_value"
    assert (work / "pkg.py").read_text() == PROJECT["pkg.py"]  # taken back


def test_a_mutant_its_own_tests_see_is_killed_there(mutants, project):
    work, run = project
    m = mutant("def f():\n    return 1", "def f():\n    return 2",
               tests=["test/test_rest.py"])  # fmt: skip
    outcome, by, _ = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert (outcome, by) == ("killed", "its tests: test/test_rest.py::test_value")


def test_a_killer_whose_id_holds_spaces_is_run_again_by_that_id(mutants, project):
    work, run = project
    m = mutant("def g():\n    return 1", "def g():\n    return 2")
    outcome, by, last = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert (outcome, by) == (
        "killed",
        "the suite: test/test_spaced.py::test_g[g is one]",
    )


def test_a_mutant_the_whole_suite_misses_survives(mutants, project):
    """The failing GPU-script test is left out as the release's session
    leaves it out (0.5.16); on 0.5.17 it runs, fails without the mutant
    too, and kills nothing."""
    work, run = project
    (work / "test" / "test_spaced.py").unlink()
    m = mutant("def g():\n    return 1", "def g():\n    return 2")
    outcome, _, last = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert outcome == "SURVIVED", last
    outcome, by, last = mutants.judge(m, work / "pkg.py", "0.5.17", run)
    assert outcome == "ERROR" and "test/e2e/test_script.py" in by
    assert "fails without the mutant too" in last
    assert (work / "pkg.py").read_text() == PROJECT["pkg.py"]


def test_a_find_text_not_there_once_is_an_error(mutants, project):
    work, run = project
    m = mutant("return 1", "return 2")  # twice in the file
    outcome, _, last = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert (outcome, last) == ("ERROR", "find text occurs 2 times")


def test_own_tests_that_cannot_run_are_an_error(mutants, project):
    work, run = project
    m = mutant("def f():\n    return 1", "def f():\n    return 2",
               tests=["test/test_missing.py"])  # fmt: skip
    outcome, by, last = mutants.judge(m, work / "pkg.py", "0.5.16", run)
    assert (outcome, by) == ("ERROR", "its tests") and "pytest exit" in last


def test_both_distributions_import_from_the_scratch_copy(mutants, tmp_path):
    """The plugin and the benchmark distribution (whose package is
    ``benchmark/`` itself) import from the copy, not from their installs:
    a mutant in ``benchmark/`` is what its tests run."""
    import subprocess

    mutants.copy_checkout(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(mutants.import_paths(tmp_path)))
    code = (
        "import sglang_dspark_dp.upstream as u\n"
        "import sglang_dspark_dp_bench.gsm8k.client as c\n"
        "print(u.__file__); print(c.__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for line in out.stdout.split():
        assert Path(line).is_relative_to(tmp_path), line


def test_a_scratch_copy_copies_itself_again(mutants, tmp_path, monkeypatch):
    """The suite a mutant is judged by runs in the scratch copy, which is
    not a git checkout: the copy made from there takes its files, not its
    caches or its import links (on 2026-12-07 the copy needed git there,
    and every mutant that reached the rest of the suite was an error)."""
    src = tmp_path / "scratch"
    (src / "python" / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "python" / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "python" / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    (src / "README.md").write_text("r\n")
    (src / ".mutants-import").mkdir()
    (src / ".mutants-import" / "bench").symlink_to(src / "python")
    monkeypatch.setattr(mutants, "ROOT", src)
    dest = tmp_path / "again"
    mutants.copy_checkout(dest)
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["README.md", "python/pkg/mod.py"], got


def test_every_mutant_still_finds_its_text_once(mutants):
    """A change to the code a mutant rewrites must carry the mutant along:
    its ``find`` text occurs exactly once in its file, or the mutant is an
    ERROR in the next run instead of a verdict (verify's OK exit moved
    under the watch's verdict once, and its mutant did not follow)."""
    stale = [
        m["id"]
        for m in mutants.load()
        if (ROOT / m["file"]).read_text().count(m["find"]) != 1
    ]
    assert stale == []
