"""The public status type of each repair: an outcome and the reason for it.

The plugin's log line, ``doctor``, ``verify`` and the benchmarks all print
from :class:`Status`; nothing else invents status words. Like Sentry's
integrations, a repair that cannot apply raises :class:`DidNotEnable` with
the reason, and the registry turns that into a ``NOT_APPLICABLE`` status
instead of a crash.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class DidNotEnable(Exception):  # noqa: N818 - the name Sentry's integrations use
    """A repair cannot apply to the installed SGLang; the message says why."""


class Outcome(str, enum.Enum):
    """What a repair did in this process."""

    ENABLED = "enabled"  # the bug is there and the hook is registered
    NOT_NEEDED = "not needed"  # the installed SGLang behaves correctly
    NOT_APPLICABLE = "not applicable"  # cannot apply here (DidNotEnable)
    NOT_INSTRUMENTED = "not instrumented"  # not tried yet, or uninstrumented


@dataclasses.dataclass(frozen=True)
class Status:
    """One repair's state: ``outcome`` and a one-line ``reason``.

    ``detail`` holds what the repair found (e.g. which fields the stock code
    leaves missing) for ``doctor --json``.
    """

    repair: str
    outcome: Outcome
    reason: str
    sglang: str | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What the repair's probe found of each upstream change it stands in
    #: for (:class:`sglang_dspark_dp.upstream.Verdict`), in this build.
    verdicts: tuple[Any, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.outcome is Outcome.ENABLED

    @property
    def healthy(self) -> bool:
        """The installed SGLang behaves correctly in this process (repaired
        or never broken)."""
        return self.outcome in (Outcome.ENABLED, Outcome.NOT_NEEDED)

    def changes(self) -> str:
        """The upstream changes, in this build's terms: the ones missing
        (which the repair stands in for) first."""
        parts = []
        for state in ("not in this build", "in this build", "not affected"):
            labels = [v.change.label for v in self.verdicts if v.state.value == state]
            if labels:
                parts.append(f"{', '.join(labels)} {state}")
        return "; ".join(parts)

    def line(self) -> str:
        """The one log line of this repair."""
        on = f" on sglang {self.sglang}" if self.sglang else ""
        changes = self.changes()
        changes = f" ({changes})" if changes else ""
        return (
            f"sglang-dspark-dp: {self.repair}: {self.outcome.value}{on}{changes}: "
            f"{self.reason}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "repair": self.repair,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "sglang": self.sglang,
            "detail": dict(self.detail),
            "changes": [v.as_dict() for v in self.verdicts],
        }
