"""Entry point of the ``sglang.srt.plugins`` group.

``sglang serve`` (its HTTP process and every scheduler process) calls
``sglang.srt.plugins.load_plugins()``, which calls :func:`register` and then
``HookRegistry.apply_hooks()``. :func:`register` arms the repairs, logs one
line saying so and returns: it imports nothing of SGLang's and runs no
probe. Each repair probes, registers its hook and applies it when the
SGLang module that arms it is first imported in the process (as
OpenTelemetry's instrumentations defer their patching to a post-import
hook), and then logs its one line (enabled, not needed, or not applicable
and why). So the HTTP process, which never imports DSpark, pays nothing
more. Nothing here raises: a repair that cannot apply changes nothing, and
SGLang starts exactly as it would without the plugin.
``SGLANG_PLUGINS=dspark_dp`` (or any list without it) whitelists plugins as
SGLang documents; ``SGLANG_DSPARK_DP_DISABLE=1`` keeps the plugin installed
but patches nothing (one line says so), e.g. to judge an SGLang build that
carries a backported fix on its own.
"""

from __future__ import annotations

import logging
import sys

from sglang_dspark_dp.settings import DISABLE_ENV, switch

logger = logging.getLogger("sglang_dspark_dp")

#: Entry-point group, name and value (pyproject.toml declares them; a test
#: keeps the two in step).
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "dspark_dp"
ENTRY_POINT = "sglang_dspark_dp.plugin:register"


def disabled() -> bool:
    """Whether ``SGLANG_DSPARK_DP_DISABLE`` turns the plugin off."""
    return switch(DISABLE_ENV, meaning="the plugin stays on")


def _ensure_visible() -> None:
    # load_plugins() can run before SGLang configures logging (no handler
    # at all: ours prints the lines) or after some SGLang module added a
    # root handler while the root level stays WARNING (0.5.21+ on import of
    # the scheduler): our INFO lines must still reach a handler, so the
    # plugin's logger is set to INFO unless someone set its level.
    if logger.level == logging.NOTSET and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def report(statuses: list) -> None:
    """One line per repair status."""
    for st in statuses:
        if st.healthy:
            logger.info("%s", st.line())
        else:
            logger.warning("%s; nothing patched", st.line())


def register() -> None:
    """Arm every repair: each is probed, hooked and applied when the SGLang
    module that arms it is first imported in this process."""
    _ensure_visible()
    if disabled():
        logger.warning("sglang-dspark-dp: disabled by %s; nothing patched", DISABLE_ENV)
        return
    from sglang_dspark_dp.package import missing_runtime

    missing = missing_runtime()
    if missing is not None:  # the wrong venv: one line, not one per repair
        logger.warning("sglang-dspark-dp: not applied: %s; nothing patched", missing)
        return
    try:
        from sglang_dspark_dp import registry
        from sglang_dspark_dp.package import installed_sglang_version

        logger.info(
            "sglang-dspark-dp: %d repairs armed on sglang %s: each probes and "
            "applies when DSpark's module it patches is first imported in this "
            "process (%s)",
            len(registry.names()),
            installed_sglang_version(),
            ", ".join(registry.names()),
        )
        registry.arm(report)
    except Exception as exc:  # never crash a server over the plugin
        logger.warning("sglang-dspark-dp: not applied: %s: %s", type(exc).__name__, exc)
