"""Entry point of the ``sglang.srt.plugins`` group.

``sglang serve`` (and every scheduler process) calls
``sglang.srt.plugins.load_plugins()``, which calls :func:`register` and then
``HookRegistry.apply_hooks()``. :func:`register` never raises: if the repair
cannot apply it logs one line saying why and returns, and SGLang starts
exactly as it would without the plugin. ``SGLANG_PLUGINS=dspark_dp`` (or any
list without it) whitelists plugins as SGLang documents.
"""

from __future__ import annotations

import logging
import sys

from sglang_dspark_dp.package import installed_sglang_version, missing_runtime

logger = logging.getLogger("sglang_dspark_dp")

#: Entry-point group, name and value (pyproject.toml declares them; a test
#: keeps the two in step).
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "dspark_dp"
ENTRY_POINT = "sglang_dspark_dp.plugin:register"


def _ensure_visible() -> None:
    # load_plugins() runs before SGLang configures logging; without a handler
    # our one INFO line would be dropped by logging's last-resort handler.
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def register() -> None:
    """Probe the installed SGLang and register the repair hook if needed."""
    _ensure_visible()
    missing = missing_runtime()
    if missing is not None:
        logger.warning("sglang-dspark-dp: not applied: %s; nothing patched", missing)
        return
    version = installed_sglang_version() or "unknown"
    try:
        from sglang_dspark_dp.srt.speculative import dspark_worker

        plan = dspark_worker.instrument(apply=False)
    except Exception as exc:  # DidNotEnable, or anything unforeseen
        logger.warning("sglang-dspark-dp: not applied on sglang %s: %s", version, exc)
        return
    probe = dspark_worker.state().probe
    if not plan.patches:
        logger.info(
            "sglang-dspark-dp: not needed on sglang %s: the DSpark draft batch "
            "already carries its DP/EP metadata; nothing patched",
            version,
        )
        return
    missing = sorted(set(probe.missing_dp) | set(probe.missing_local))
    logger.info(
        "sglang-dspark-dp: repairing the DSpark draft batch on sglang %s "
        "(missing: %s; %s; guard %s)",
        version,
        ", ".join(missing) or "none",
        plan.describe(),
        "on" if plan.guard else "off",
    )
