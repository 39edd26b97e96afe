"""Test matrix: the regression suite against each supported SGLang release,
each installed from PyPI with its own dependencies, plus the style hooks."""

from __future__ import annotations

import nox

#: SGLang releases the suite runs against (0.5.16: affected; 0.5.17: the
#: upstream fix; 0.5.23: latest at the time of writing).
SGLANG_VERSIONS = ["0.5.16", "0.5.17", "0.5.23"]

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check + ruff format + file hygiene, as pre-commit runs them."""
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure")


@nox.session(python="3.11")
@nox.parametrize("sglang", SGLANG_VERSIONS)
def tests(session: nox.Session, sglang: str) -> None:
    session.install(f"sglang=={sglang}", "pytest>=8", "matplotlib", "tqdm")
    session.install("--no-deps", "-e", ".")
    session.run(
        "python",
        "-m",
        "pytest",
        "test",
        "-q",
        "-W",
        "ignore::UserWarning",
        *session.posargs,
        success_codes=[0, 5],
    )
