"""How each release's stock DSpark behaves: the suite's one table.

``dp``: the DP-attention draft batch misses fields (stock ``can_run_graph``
then crashes with ``expectations.KNOWN_CRASH``); ``local``: the attention-TP
draft batch misses the non-padded counts; ``blocks``: the stock DP fill,
though complete, makes the host wait for the GPU (a device tensor straight
from host data); ``startup_tp`` / ``startup_dp``: stock ranks can disagree
on the draft CUDA-graph capture at startup under plain TP / DP attention
(from 0.5.19 plain TP reduces through ``SpecTpSync``, built on the TP group;
under DP attention with attention TP 1 its group has one rank);
``non_overlap``: with ``--disable-overlap-schedule`` the scheduler's call to
the DSpark worker raises ``TypeError`` at every step (SGLang #39262);
``folded``: the release decides folded sampling from free memory at
startup (0.5.17-0.5.18 by its own rank-local reading, 0.5.19-0.5.21 from
the reading the worker hands it), so where that reading is rank-local
(``startup_tp`` / ``startup_dp``) ranks can fold differently and mismatch a
collective at the first sampling step; ``compact_verify``: with a budget-scheduling ragged verify mode the ranks
of a TP group pick the verify graph tier from their own budget, and a rank
whose confidences are late leaves the ``verify_lens`` broadcast (SGLang
#31195). Each row was
measured: the probes (``sglang-dspark-dp doctor --json``) and
``sglang-dspark-dp verify --no-fix`` on that release (see
``COMPATIBILITY.md``). The probes must find exactly this; a release whose
behaviour changes fails the suite instead of being silently re-classified.

Backport mode: a maintainer who cherry-picks a fix onto a release branch
runs the suite on that build with ``SGLANG_DSPARK_DP_BACKPORT`` naming the
fixes it carries (``draft-batch``, ``startup-capture``,
``non-overlap-entry``, ``verify-budget``, comma-separated;
``nox -s backport`` sets it). The plugin then stays off, and the row of the
build's version is read with those fixes in place: the suite passes only if
SGLang alone behaves as fixed.
"""

from __future__ import annotations

import os

BACKPORT_ENV = "SGLANG_DSPARK_DP_BACKPORT"

#: What each fix, once in a build, clears from its row.
FIXES = {
    "draft-batch": {"dp": False, "local": False, "blocks": None},
    "startup-capture": {"startup_tp": False, "startup_dp": False},
    "non-overlap-entry": {"non_overlap": False},
    "verify-budget": {"compact_verify": False},
}

KNOWN = {
    "0.5.16": {
        "dp": True,
        "local": True,
        "blocks": False,
        "startup_tp": True,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": False,
    },
    "0.5.17": {
        "dp": False,
        "local": True,
        "blocks": True,
        "startup_tp": True,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": True,
    },
    "0.5.18": {
        "dp": False,
        "local": False,
        "blocks": True,
        "startup_tp": True,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": True,
    },
    "0.5.19": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
        "non_overlap": True,
        "compact_verify": True,
        "folded": True,
    },
    "0.5.20": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
        "non_overlap": True,
        "compact_verify": True,
        "folded": True,
    },
    "0.5.21": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": True,
    },
    "0.5.22": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": False,
    },
    "0.5.23": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
        "non_overlap": False,
        "compact_verify": True,
        "folded": False,
    },
}


def backport_fixes() -> tuple[str, ...]:
    """The fixes ``SGLANG_DSPARK_DP_BACKPORT`` says the build carries
    (empty: not in backport mode). An unknown name is an error naming it."""
    raw = os.environ.get(BACKPORT_ENV, "")
    fixes = tuple(f.strip() for f in raw.split(",") if f.strip())
    unknown = [f for f in fixes if f not in FIXES]
    if unknown:
        raise ValueError(
            f"{BACKPORT_ENV}={raw!r}: unknown fix {', '.join(unknown)} "
            f"(known: {', '.join(FIXES)})"
        )
    return fixes


def known(version: str):
    """The recorded behaviour of ``version`` (None: not recorded), with the
    backported fixes in place in backport mode (``blocks`` None: either)."""
    row = KNOWN.get(version)
    if row is None:
        return None
    row = dict(row)
    for fix in backport_fixes():
        row.update(FIXES[fix])
    return row


def needs(version: str) -> dict[str, bool] | None:
    """Which repair the recorded behaviour needs (None: not recorded)."""
    row = known(version)
    if row is None:
        return None
    return {
        "draft-batch": bool(row["dp"] or row["local"] or row["blocks"]),
        "startup-capture": bool(row["startup_tp"] or row["startup_dp"]),
        "non-overlap-entry": bool(row["non_overlap"]),
        "verify-budget": bool(row["compact_verify"]),
    }
