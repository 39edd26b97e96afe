"""Test matrix: every SGLang release with DSpark, each installed from PyPI
with uv into its own venv, plus the style hooks.

Default sessions (what ``scripts/run-tests.sh`` and CI run):

* ``lint``: ruff check, ruff format and file hygiene, as pre-commit runs them;
* ``tests(sglang=V)``: the full suite, on one release of each behaviour
  class (0.5.16: the draft batch crashes; 0.5.17: fixed upstream but
  blocking; 0.5.20: the draft batch complete, the startup reading through
  ``SpecTpSync``; 0.5.23: the latest); ``test/unit`` (the plugin's own
  code) on 0.5.16 and 0.5.17;
* ``smoke(sglang=V)``: every other release: the probes against the recorded
  behaviour, every repair enabled where needed, ``doctor``, a short
  ``verify`` both ways, the CLI, ``judge``'s verdicts, the probes' answers
  in any process state, and the fill's fidelity to stock.

Not run by default:

* ``compat(sglang=V)``: the full suite, ``doctor --json`` and a short
  ``verify`` without and with the plugin on every release; writes
  ``compat/<V>.json`` and regenerates ``COMPATIBILITY.md``;
* ``mutants(sglang=V)``: each mutant of ``test/mutants.toml`` (one small
  bug per row of ``docs/promises.md``) applied to a scratch copy and judged
  by the release's whole suite there (its own tests first, then the rest);
  fails unless every live mutant is killed (0.5.16 and 0.5.23);
* ``backport -- PATH [CHANGE ...]``: an SGLang build (source tree or wheel)
  that carries backported upstream changes, judged alone by behaviour
  (plugin off), one verdict per change.

A session fails when pytest fails, when it collects nothing (pytest's exit
5 is a failure here), and when fewer tests ran than its floor: a suite that
silently shrinks is not green.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import nox

#: Every SGLang release with DSpark: which session CI gives it, the fewest
#: tests (passed, not skipped) that session may run there, and whether the
#: release pins ``cuda-tile`` (a download-only source stub on PyPI that
#: fetches from an index these machines cannot reach; nothing in those
#: releases imports it, so it is excluded from their install).
RELEASES = {
    "0.5.16": ("tests", 440, False),
    "0.5.17": ("tests", 510, False),  # with the benchmarks' tests
    "0.5.18": ("smoke", 44, True),
    "0.5.19": ("smoke", 44, True),
    "0.5.20": ("tests", 400, True),
    "0.5.21": ("smoke", 14, True),
    "0.5.22": ("smoke", 14, True),
    "0.5.23": ("tests", 400, False),
}
FULL = [v for v, (kind, _, _) in RELEASES.items() if kind == "tests"]
SMOKE = [v for v, (kind, _, _) in RELEASES.items() if kind == "smoke"]
#: The one release whose full session also runs the tests of the scripts
#: made for the GPU machine: the benchmarks' and e2e/'s (``run_e2e.sh`` and
#: its init hook, which the device chain runs on 0.5.17). They drive the
#: installed SGLang the same way on every release, and each starts fresh
#: interpreters: minutes on two cores.
BENCH_RELEASE = "0.5.17"
SCRIPT_TESTS = ("test/benchmark", "test/e2e")
#: The full releases whose session also runs ``test/unit``: the plugin's own
#: code, which reads nothing of the installed release but the wheel lock of
#: the releases the device run stages (0.5.16 and 0.5.17).
UNIT_RELEASES = ("0.5.16", "0.5.17")
#: The smoke set: what every release gets.
SMOKE_TESTS = (
    "test/srt/test_release_behaviour.py",
    "test/srt/test_cli.py",
    "test/srt/test_fidelity.py",
    "test/srt/test_process_state.py",
    "test/srt/test_backport.py",
    "test/srt/test_diverge.py",
    # The watch's short run (the stock defects named and the plugin silent:
    # test_diverge's replay with the watch): an input of a watched
    # decision perturbed on one rank, named with the plugin on.
    "test/srt/test_watch.py::test_one_rank_seeing_other_sync_sizes_is_named_with_the_plugin_on",
    # ... and a rank whose non-overlap call is refused, named beside its
    # peers (runs where the build has #39262's defect: 0.5.19).
    "test/srt/test_watch.py::test_a_rank_whose_call_is_refused_is_named_beside_the_peers_that_went_on",
)
#: The suite a backport build runs with the plugin off, per upstream change
#: it carries (``sglang_dspark_dp.upstream``).
BACKPORT_TESTS = {
    "dp-draft-metadata": ("test/srt/test_dspark_dp_attention.py",),
    "tp-draft-non-padded": ("test/srt/test_dspark_dp_attention.py",),
    "dp-fill-no-host-wait": ("test/srt/test_dspark_dp_attention.py",),
    "spec-tp-sync": ("test/srt/test_dspark_startup_consensus.py",),
    "capture-group-memory": (
        "test/srt/test_dspark_startup_consensus.py",
        "test/srt/test_capture_group_memory.py",
    ),
    "verify-budget-broadcast": ("test/srt/test_dspark_compact_verify.py",),
    "relay-wait": ("test/srt/test_relay_wait.py",),
    "non-overlap-pp-proxy": ("test/srt/test_dspark_non_overlap.py",),
}
BACKPORT_COMMON = ("test/srt/test_release_behaviour.py",)
#: The check that every committed compatibility row measured the repairs as
#: they are: the compat session is what measures them again, so it leaves
#: out the check of the rows it is replacing.
FRESHNESS_TEST = (
    "test/unit/test_compat_table.py::test_every_row_measured_the_repairs_as_they_are"
)
#: ... and the check that the committed table renders the committed rows,
#: which it rewrites one release at a time.
TABLE_TEST = (
    "test/unit/test_compat_table.py::"
    "test_the_committed_table_is_the_rendering_of_the_committed_rows"
)
#: Prints the change keys a list of names means (names, PR or issue
#: numbers, repairs), resolved by the plugin itself in the session's venv.
RESOLVE = (
    "import sys; from sglang_dspark_dp import registry, upstream; "
    "groups = {n: registry.repair(n).stands_in_for for n in registry.names()}; "
    "print(','.join(upstream.resolve(sys.argv[1], groups)))"
)

nox.options.sessions = ["lint", "tests", "smoke"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "uv"


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check + ruff format + file hygiene, as pre-commit runs them."""
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure")


def ran_tests(junit: str) -> int:
    """Tests that ran and did not skip, from pytest's JUnit XML."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    return sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites)


def _excludes(session: nox.Session) -> list[str]:
    path = os.path.join(session.create_tmp(), "excludes.txt")
    with open(path, "w") as f:
        f.write("cuda-tile\n")
    return ["--excludes", path]


def install(session: nox.Session, sglang: str) -> None:
    """SGLang ``sglang`` (a version from PyPI, or a path to a build), its
    dependencies, the test tools, and this repository (editable)."""
    pins_cuda_tile = RELEASES.get(sglang, ("", 0, True))[2]
    spec = f"sglang=={sglang}" if sglang in RELEASES else sglang
    extra = _excludes(session) if pins_cuda_tile else []
    session.install(*extra, spec, "pytest>=8", "matplotlib", "tqdm")
    # The benchmarks are their own distribution (one import name); the "./"
    # keeps the installer from taking the folder name for a PyPI project.
    session.install("--no-deps", "-e", ".", "-e", "./benchmark")
    session.install(*EXTRA_REQUIREMENTS)


def _extra(name: str) -> list[str]:
    """The plugin's optional requirements ``name``, as pyproject.toml pins
    them (one place)."""
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"][name]


#: What the suite needs beyond SGLang and the test tools: ``diverge``'s
#: hypothesis.
EXTRA_REQUIREMENTS = _extra("diverge")


def pytest(
    session: nox.Session, *paths: str, floor: int | None, record: bool = False, **env
) -> str:
    """Run pytest on ``paths``; ``record``: a failing suite does not stop the
    session (its result goes into the compatibility row)."""
    junit = os.path.join(session.create_tmp(), "junit.xml")
    session.run(
        "python",
        "-m",
        "pytest",
        *paths,
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::UserWarning",
        f"--junitxml={junit}",
        *session.posargs,
        env=env,
        success_codes=[0, 1] if record else [0],
    )
    ran = ran_tests(junit)
    if floor is not None and not session.posargs and ran < floor:
        session.error(
            f"only {ran} tests ran in {session.name}; it runs at least {floor}: "
            "tests were lost (collection, skips)"
        )
    session.log(f"{ran} tests ran in {session.name}")
    return junit


@nox.session(python="3.11")
@nox.parametrize("sglang", FULL)
def tests(session: nox.Session, sglang: str) -> None:
    install(session, sglang)
    skip = [] if sglang == BENCH_RELEASE else [f"--ignore={t}" for t in SCRIPT_TESTS]
    skip += [] if sglang in UNIT_RELEASES else ["--ignore=test/unit"]
    pytest(session, "test", *skip, floor=RELEASES[sglang][1])


@nox.session(python="3.11")
@nox.parametrize("sglang", SMOKE)
def smoke(session: nox.Session, sglang: str) -> None:
    install(session, sglang)
    pytest(session, *SMOKE_TESTS, floor=RELEASES[sglang][1])


@nox.session(python="3.11")
@nox.parametrize("sglang", list(RELEASES))
def compat(session: nox.Session, sglang: str) -> None:
    """The suite (the benchmarks' scripts aside), judge, doctor and a short
    verify both ways on one release; its row in ``compat/`` and the table in
    ``COMPATIBILITY.md`` (the committed-table and freshness tests are left
    out: this session is what makes them pass)."""
    install(session, sglang)
    junit = pytest(
        session,
        "test",
        "--ignore=test/benchmark",
        f"--deselect={FRESHNESS_TEST}",
        f"--deselect={TABLE_TEST}",
        floor=None,
        record=True,
    )
    session.run("python", "scripts/compat.py", "row", "--junit", junit)
    session.run("python", "scripts/compat.py", "table")
    session.run("python", "scripts/compat.py", "check", junit)


#: The releases ``nox -s mutants`` runs on: the one whose stock draft batch
#: crashes (every repair live) and the latest.
MUTANT_RELEASES = ["0.5.16", "0.5.23"]


@nox.session(python="3.11")
@nox.parametrize("sglang", MUTANT_RELEASES)
def mutants(session: nox.Session, sglang: str) -> None:
    """Apply each mutant of ``test/mutants.toml`` to a scratch copy and run
    its tests, then, if they pass, the rest of the release's suite; fails
    unless every live mutant is killed (``scripts/mutants.py``; arguments
    after ``--`` go to it)."""
    install(session, sglang)
    session.run("python", "scripts/mutants.py", *session.posargs)


@nox.session(python="3.11")
def backport(session: nox.Session) -> None:
    """``nox -s backport -- PATH [CHANGE ...]``: install the SGLang build at
    PATH (a source tree or a wheel) and judge it alone, plugin off: ``judge``
    and the suite of each upstream change it carries (names, PR or issue
    numbers, or a repair's name for all it stands in for; default: every
    change)."""
    if not session.posargs:
        session.error(
            "usage: nox -s backport -- PATH [CHANGE ...] (PATH: an SGLang source "
            f"tree or wheel; CHANGE: {', '.join(BACKPORT_TESTS)}, a PR number "
            "such as 33098, or a repair's name)"
        )
    path, *names = session.posargs
    if not os.path.exists(path):
        session.error(f"PATH {path!r} does not exist")
    install(session, path)
    names = names or list(BACKPORT_TESTS)
    try:
        resolved = session.run(
            "python", "-c", RESOLVE, ",".join(names), silent=True
        ).strip()
    except Exception:  # resolve() names what it does not know
        session.error(f"unknown change in {names}; known: {', '.join(BACKPORT_TESTS)}")
    fixes = resolved.splitlines()[-1].split(",")
    env = {
        "SGLANG_DSPARK_DP_DISABLE": "1",
        "SGLANG_DSPARK_DP_BACKPORT": ",".join(fixes),
    }
    session.run("sglang-dspark-dp", "judge", "--fixes", ",".join(fixes), env=env)
    paths = list(
        dict.fromkeys(
            [p for f in fixes for p in BACKPORT_TESTS[f]] + list(BACKPORT_COMMON)
        )
    )
    session.posargs.clear()
    pytest(session, *paths, floor=None, **env)
