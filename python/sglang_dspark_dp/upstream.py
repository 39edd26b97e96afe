"""The upstream SGLang changes the plugin speaks in.

A maintainer's unit is an upstream change: the one thing they can
cherry-pick onto a release branch. Each repair stands in for one or more of
them where a build lacks them; ``judge``, ``doctor``, the log lines, the
backport session and the compatibility table all name these, from here.

A build either carries a change (``in this build``), lacks it while its
defect is there (``not in this build``), or is ``not affected``: the code
the change fixes is absent (e.g. the non-overlap entry's ``TypeError`` needs
a scheduler that passes ``pp_proxy_tensors``). Where a change's PR is not
identified, its name is its key and the first release that ships it.
"""

from __future__ import annotations

import dataclasses
import enum


class State(str, enum.Enum):
    """Whether a build carries a change."""

    IN = "in this build"
    NOT_IN = "not in this build"
    NOT_AFFECTED = "not affected"

    @property
    def ok(self) -> bool:
        """The build behaves correctly without the plugin here."""
        return self is not State.NOT_IN


@dataclasses.dataclass(frozen=True)
class Change:
    """One upstream change."""

    key: str  # stable name; ``--fixes`` takes it
    summary: str  # what a build that carries it does
    pr: int | None = None  # upstream pull request (None: not identified)
    issue: int | None = None  # upstream issue it fixes
    first_release: str | None = None  # first PyPI release with it (None: none)
    #: Changes whose defect this change's own code brings into a build that
    #: was not affected by them (#33098's fill makes a device tensor from a
    #: host int, the host wait ``dp-fill-no-host-wait`` removes).
    introduces: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How the change is named to a maintainer: its PR, else its issue,
        else its key."""
        if self.pr is not None:
            return f"#{self.pr}"
        if self.issue is not None:
            return f"#{self.issue}"
        return self.key

    @property
    def title(self) -> str:
        """The label with the key, and where it ships."""
        where = (
            f"in SGLang {self.first_release}+"
            if self.first_release
            else "in no release yet"
        )
        name = self.label if self.label == self.key else f"{self.label} {self.key}"
        return f"{name} ({where})"

    def aliases(self) -> set[str]:
        out = {self.key}
        for number in (self.pr, self.issue):
            if number is not None:
                out |= {str(number), f"#{number}"}
        return out


CHANGES: tuple[Change, ...] = (
    Change(
        "dp-draft-metadata",
        "the DP-attention draft batch carries original_global_num_tokens_cpu and "
        "the non-padded counts",
        pr=33098,
        issue=33286,
        first_release="0.5.17",
        introduces=("dp-fill-no-host-wait",),
    ),
    Change(
        "tp-draft-non-padded",
        "the attention-TP draft batch (EP without DP attention) carries its "
        "non-padded counts",
        first_release="0.5.18",
    ),
    Change(
        "dp-fill-no-host-wait",
        "the DP fill writes its device counts without making the host wait for "
        "the GPU",
        first_release="0.5.19",
    ),
    Change(
        "spec-tp-sync",
        "the startup free-memory reading (draft capture, folded sampling) is "
        "reduced over the TP group through SpecTpSync",
        pr=33614,
        first_release="0.5.19",
    ),
    Change(
        "capture-group-memory",
        "SpecTpSync.available_memory_gb reduces over the capture group it is "
        "passed when its own group has one rank (DP attention, attention TP 1)",
        pr=39954,
        issue=39886,
    ),
    Change(
        "verify-budget-broadcast",
        "every rank of the verify group uses the first rank's compact-verify "
        "budget, so all pick one verify graph tier",
        pr=31195,
    ),
    Change(
        "relay-wait",
        "ConfidenceRelay.resolve waits for a lagged confidence copy still in "
        "flight instead of returning None on that rank alone (upstream's "
        "test_dspark_confidence_relay.py)",
    ),
    Change(
        "non-overlap-pp-proxy",
        "DSparkWorkerV2.forward_batch_generation takes the pp_proxy_tensors the "
        "non-overlap scheduler passes",
        issue=39262,
        first_release="0.5.21",
    ),
)

_BY_KEY = {c.key: c for c in CHANGES}


def change(key: str) -> Change:
    return _BY_KEY[key]


def keys() -> list[str]:
    return [c.key for c in CHANGES]


def resolve(names: str, groups: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The change keys a comma-separated list names: keys, PR or issue
    numbers (``33098`` or ``#33098``), or a name in ``groups`` (a repair's
    name: every change it stands in for). Raises ValueError naming what it
    does not know."""
    groups = groups or {}
    out: list[str] = []
    unknown: list[str] = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        found = [c.key for c in CHANGES if name in c.aliases()]
        if not found and name in groups:
            found = list(groups[name])
        if not found:
            unknown.append(name)
        for key in found:
            if key not in out:
                out.append(key)
    if unknown or not out:
        known = ", ".join(
            c.key if c.label == c.key else f"{c.key} ({c.label})" for c in CHANGES
        )
        raise ValueError(
            f"unknown change {', '.join(repr(u) for u in unknown) or repr(names)}; "
            f"known: {known}"
            + (f"; or a repair: {', '.join(groups)}" if groups else "")
        )
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether this build carries one change, and what was measured."""

    key: str
    state: State
    evidence: str

    @property
    def change(self) -> Change:
        return _BY_KEY[self.key]

    def line(self) -> str:
        head = f"{self.change.label}"
        if self.change.label != self.key:
            head += f" {self.key}"
        return f"{head}: {self.state.value}: {self.evidence}"

    def as_dict(self) -> dict[str, str]:
        return {
            "change": self.key,
            "label": self.change.label,
            "state": self.state.value,
            "evidence": self.evidence,
        }


def with_backports(
    row: dict[str, State], carried: tuple[str, ...] | list[str]
) -> dict[str, State]:
    """A release's recorded states once a build carries the changes
    ``carried`` (backport mode): those are in; a change whose defect a
    carried change's code brings in, and which the release was not affected
    by, is then not in (unless carried too)."""
    out = dict(row)
    for key in carried:
        for brought in _BY_KEY[key].introduces:
            if out.get(brought) is State.NOT_AFFECTED and brought not in carried:
                out[brought] = State.NOT_IN
    for key in carried:
        out[key] = State.IN
    return out
