"""How each release's stock DSpark behaves: the suite's one table, in
upstream changes (``sglang_dspark_dp.upstream``).

Each row gives every change's state in the release as measured (the
repairs' probes, ``sglang-dspark-dp judge`` and ``verify --no-fix``; see
``COMPATIBILITY.md``): ``IN`` (the build carries it), ``OUT`` (its defect is
there) or ``NA`` (not affected: the code the change fixes is absent), and
``folded``: whether the release decides folded sampling from free memory at
startup (0.5.17-0.5.18 by its own rank-local reading, 0.5.19-0.5.21 from the
reading the worker hands it; where that reading is rank-local, ranks can
fold differently and mismatch a collective at the first sampling step).
The probes must find exactly this; a release whose behaviour changes fails
the suite instead of being silently re-classified.

:func:`known` also gives the behaviours the tests read, derived from the
states: ``dp`` (#33098 missing: the DP-attention draft batch misses fields,
and stock ``can_run_graph`` crashes), ``local`` (the attention-TP draft
batch misses its non-padded counts), ``blocks`` (the DP fill makes the host
wait for the GPU), ``startup_tp`` / ``startup_dp`` (ranks can disagree on
draft capture under plain TP / DP attention: #33614 / #39954 missing),
``non_overlap`` (#39262: every non-overlap step raises ``TypeError``),
``compact_verify`` (#31195: ranks pick their own compact-verify tier) and
``late_relay`` (a rank whose lagged confidences are late resolves None
alone).

Backport mode: a maintainer who cherry-picks upstream changes onto a release
branch runs the suite on that build with ``SGLANG_DSPARK_DP_BACKPORT``
naming them (change names, PR numbers or repair names, comma-separated;
``nox -s backport`` sets it). The plugin then stays off, and the row of the
build's version is read with those changes in place (and with any defect
their own code brings in): the suite passes only if SGLang alone behaves as
that row says.
"""

from __future__ import annotations

import os

from sglang_dspark_dp import upstream
from sglang_dspark_dp.upstream import State

BACKPORT_ENV = "SGLANG_DSPARK_DP_BACKPORT"

IN, OUT, NA = State.IN, State.NOT_IN, State.NOT_AFFECTED

#: Column order of the rows below.
COLUMNS = (
    "dp-draft-metadata",  # #33098
    "tp-draft-non-padded",
    "dp-fill-no-host-wait",
    "spec-tp-sync",  # #33614
    "capture-group-memory",  # #39954
    "verify-budget-broadcast",  # #31195
    "relay-wait",
    "non-overlap-pp-proxy",  # #39262
)

_ROWS = {
    #          33098 tp   wait 33614 39954 31195 relay 39262  folded
    "0.5.16": (OUT, OUT, NA, OUT, OUT, OUT, OUT, NA, False),
    "0.5.17": (IN, OUT, OUT, OUT, OUT, OUT, OUT, NA, True),
    "0.5.18": (IN, IN, OUT, OUT, OUT, OUT, OUT, NA, True),
    "0.5.19": (IN, IN, IN, IN, OUT, OUT, OUT, OUT, True),
    "0.5.20": (IN, IN, IN, IN, OUT, OUT, OUT, OUT, True),
    "0.5.21": (IN, IN, IN, IN, OUT, OUT, OUT, IN, True),
    "0.5.22": (IN, IN, IN, IN, OUT, OUT, OUT, IN, False),
    "0.5.23": (IN, IN, IN, IN, OUT, OUT, OUT, IN, False),
}

#: Each release's change states, as measured.
KNOWN: dict[str, dict[str, State]] = {
    version: dict(zip(COLUMNS, row[: len(COLUMNS)], strict=True))
    for version, row in _ROWS.items()
}
FOLDED = {version: row[len(COLUMNS)] for version, row in _ROWS.items()}

#: The behaviours the tests read, each the change whose absence makes it.
BEHAVIOURS = {
    "dp": "dp-draft-metadata",
    "local": "tp-draft-non-padded",
    "blocks": "dp-fill-no-host-wait",
    "startup_tp": "spec-tp-sync",
    "startup_dp": "capture-group-memory",
    "compact_verify": "verify-budget-broadcast",
    "late_relay": "relay-wait",
    "non_overlap": "non-overlap-pp-proxy",
}


def _groups() -> dict[str, tuple[str, ...]]:
    from sglang_dspark_dp import registry

    return {n: registry.repair(n).stands_in_for for n in registry.names()}


def backport_fixes() -> tuple[str, ...]:
    """The upstream changes ``SGLANG_DSPARK_DP_BACKPORT`` says the build
    carries (empty: not in backport mode). An unknown name is an error
    naming it."""
    raw = os.environ.get(BACKPORT_ENV, "")
    if not raw.strip():
        return ()
    try:
        return tuple(upstream.resolve(raw, _groups()))
    except ValueError as exc:
        raise ValueError(f"{BACKPORT_ENV}={raw!r}: {exc}") from None


def changes(version: str) -> dict[str, State] | None:
    """Each change's state in ``version`` (None: not recorded), with the
    backported changes in place in backport mode."""
    row = KNOWN.get(version)
    if row is None:
        return None
    return upstream.with_backports(row, backport_fixes())


def known(version: str):
    """The recorded behaviour of ``version`` (None: not recorded): every
    behaviour of :data:`BEHAVIOURS` (True: stock SGLang shows the defect),
    ``folded``, and ``changes`` (each change's state)."""
    states = changes(version)
    if states is None:
        return None
    row = {name: states[key] is OUT for name, key in BEHAVIOURS.items()}
    row["folded"] = FOLDED[version]
    row["changes"] = states
    return row


def needs(version: str) -> dict[str, bool] | None:
    """Which repair the recorded behaviour needs (None: not recorded). The
    startup reading is startup-capture's where the worker reads it itself
    (no #33614) and capture-group-memory's where it goes through
    ``SpecTpSync``."""
    row = known(version)
    if row is None:
        return None
    return {
        "draft-batch": bool(row["dp"] or row["local"] or row["blocks"]),
        "startup-capture": bool(row["startup_tp"]),
        "capture-group-memory": bool(row["startup_dp"] and not row["startup_tp"]),
        "non-overlap-entry": bool(row["non_overlap"]),
        "verify-budget": bool(row["compact_verify"]),
        "relay-wait": bool(row["late_relay"]),
    }


def skip_unless_carried(version: str, behaviour: str) -> None:
    """In backport mode (the plugin off), skip a test of a repaired
    behaviour whose change the build does not carry: the row says its
    defect is there, and nothing stands in for it."""
    import pytest

    row = known(version)
    if backport_fixes() and row is not None and row[behaviour]:
        change = upstream.change(BEHAVIOURS[behaviour])
        pytest.skip(
            f"backport mode: this build does not carry {change.label} "
            f"({change.key}) and the plugin is off"
        )
