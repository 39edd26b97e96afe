"""The plugin's environment switches, each read the same way.

A switch is on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/
``no``/``off`` or unset (case and surrounding spaces ignored). Any other
value means off and says so once per process and value, naming the variable
and the value, so a typo never silently turns something on.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("sglang_dspark_dp")

#: Turns the runtime guard on (read when the draft-batch repair instruments).
GUARD_ENV = "SGLANG_DSPARK_DP_CHECK"
#: Keeps the plugin installed but patching nothing (read by ``register``).
DISABLE_ENV = "SGLANG_DSPARK_DP_DISABLE"
#: SGLang's own switch of its rank consensus checker (0.5.19+); the plugin
#: honours it on every release to turn its watch on.
WATCH_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
#: What the watch does on a divergence: ``exit`` (the default: log, then end
#: the process) or ``log`` (log and keep serving).
WATCH_MODE_ENV = "SGLANG_DSPARK_DP_WATCH"
WATCH_MODES = ("exit", "log")
#: How long the watch's own group waits for a peer, in seconds (default
#: 600); past it the group stops watching (one line) and serves on.
WATCH_TIMEOUT_ENV = "SGLANG_DSPARK_DP_WATCH_TIMEOUT_S"

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})
_warned: set[tuple[str, str]] = set()


def switch(name: str, *, meaning: str) -> bool:
    """Whether the switch ``name`` is on; ``meaning`` says what stays off
    when the value is not understood (``"the guard stays off"``)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value not in _OFF and (name, raw) not in _warned:
        _warned.add((name, raw))
        logger.warning(
            "sglang-dspark-dp: %s=%r is neither on (1/true/yes/on) nor off "
            "(0/false/no/off); %s",
            name,
            raw,
            meaning,
        )
    return False


def choice(name: str, choices: tuple[str, ...], *, default: str) -> str:
    """The value of ``name`` among ``choices`` (case and surrounding spaces
    ignored; unset or empty: ``default``). Any other value keeps ``default``
    and says so once per process and value, naming the variable and the
    value."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in choices:
        return value
    if (name, raw) not in _warned:
        _warned.add((name, raw))
        logger.warning(
            "sglang-dspark-dp: %s=%r is not one of %s; %s stays %r",
            name,
            raw,
            "/".join(choices),
            name,
            default,
        )
    return default
