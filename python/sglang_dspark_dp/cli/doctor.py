"""``doctor``: is the installed SGLang healthy, and what did the plugin do?
One row per repair (its outcome and reason, as in its log line) and one per
upstream change (in this build, not in it, or not affected, and which repair
stands in for it). Exit 0 healthy, 1 when a repair is not loaded or cannot
apply, 2 without DSpark."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from sglang_dspark_dp.cli import common
from sglang_dspark_dp.cli.common import EXIT_CANNOT, EXIT_FAIL, EXIT_OK


def changes_of(statuses: list[Any]) -> list[dict[str, str]]:
    """Every upstream change a repair judged, in the catalogue's order, with
    the repair that judged it."""
    from sglang_dspark_dp import upstream

    found: dict[str, dict[str, str]] = {}
    for st in statuses:
        for verdict in st.verdicts:
            found.setdefault(verdict.key, dict(verdict.as_dict(), repair=st.repair))
    return [found[key] for key in upstream.keys() if key in found]


def doctor_report() -> dict[str, Any]:
    from importlib import metadata

    from sglang_dspark_dp import adapter, registry
    from sglang_dspark_dp.outcome import DidNotEnable, Outcome
    from sglang_dspark_dp.package import (
        _instruments,
        installed_sglang_version,
        version_supported,
    )
    from sglang_dspark_dp.plugin import ENTRY_POINT, PLUGIN_GROUP, PLUGIN_NAME
    from sglang_dspark_dp.srt.speculative.dspark_dp_guard import guard_enabled

    version = installed_sglang_version()
    report: dict[str, Any] = {
        "sglang_version": version,
        "supported_range": list(_instruments),
        "in_supported_range": bool(version and version_supported(version)),
        "dspark_present": False,
        "entry_point_registered": False,
        "plugin_loaded": False,
        "bug_detected": None,
        "missing_fields": {},
        "repair_applied": False,
        "repair": None,
        "reason": None,
        "guard": guard_enabled(),
        "repairs": [],
        "changes": [],
        "watch": _watch_report(None),
    }
    eps = metadata.entry_points(group=PLUGIN_GROUP)
    report["entry_point_registered"] = any(
        ep.name == PLUGIN_NAME and ep.value == ENTRY_POINT for ep in eps
    )
    if version is None:
        report["reason"] = "sglang is not installed"
        return report
    try:
        adapter.load_sglang_api()
        report["dspark_present"] = True
    except DidNotEnable as exc:
        report["reason"] = str(exc)
        return report
    try:
        # As a DSpark server's scheduler process: the plugins loaded, then
        # DSpark's worker imported, which applies the armed repairs.
        adapter.load_plugins()
    except Exception as exc:  # report, never crash
        report["reason"] = f"load_plugins() failed: {exc}"
    statuses = registry.status()
    loaded = any(s.outcome is not Outcome.NOT_INSTRUMENTED for s in statuses)
    report["plugin_loaded"] = loaded
    if not loaded and report["reason"] is None:
        if not report["entry_point_registered"]:
            why = "the entry point is not registered (reinstall the package)"
        elif not _whitelisted(PLUGIN_GROUP, PLUGIN_NAME):
            why = (
                f"SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS')!r} "
                f"does not list {PLUGIN_NAME}"
            )
        else:
            why = "load_plugins() did not call it"
        report["reason"] = f"not loaded: {why}"
    report["repairs"] = [s.as_dict() for s in statuses]
    report["changes"] = changes_of(statuses)
    report["watch"] = _watch_report(_watch_sites())
    draft = registry.repair("draft-batch")
    try:
        found = draft.probe_result or _probe_draft(draft)
    except DidNotEnable as exc:
        report["reason"] = report["reason"] or str(exc)
        return report
    report["bug_detected"] = found.affected
    report["missing_fields"] = {
        "dp_attention_path": list(found.missing_dp),
        "attention_tp_path": list(found.missing_local),
    }
    report["repair_applied"] = draft.instrumented
    if draft.plan is not None:
        report["repair"] = draft.plan.describe()
        report["guard"] = draft.plan.guard
    if report["reason"] is None:
        report["reason"] = draft.status().reason
    return report


def _watch_sites() -> list[dict[str, Any]] | None:
    from sglang_dspark_dp import watch_sites

    try:
        return watch_sites.survey()
    except Exception:  # report, never crash
        return None


def _watch_report(sites: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Whether the consensus watch is on in this environment, its mode, and
    (DSpark present) each site's decisions and whether this build lets it
    watch them."""
    from sglang_dspark_dp import watch
    from sglang_dspark_dp.settings import WATCH_ENV

    return {
        "on": watch.enabled(),
        "switch": WATCH_ENV,
        "mode": watch.mode(),
        "sites": sites or [],
    }


def _watch_row(w: dict[str, Any]) -> tuple[str, str]:
    state = f"on ({w['mode']})" if w["on"] else f"off ({w['switch']}=1 turns it on)"
    return (f"watch ({w['switch']})", state)


def _probe_draft(draft) -> Any:
    from importlib import import_module

    return import_module(type(draft).__module__).probe()


def _whitelisted(group: str, name: str) -> bool:
    """Whether SGLang's own plugin discovery (its ``SGLANG_PLUGINS``
    whitelist) admits ``name``."""
    try:
        from sglang.srt.plugins import load_plugins_by_group
    except ImportError:
        return True
    try:
        return name in load_plugins_by_group(group)
    except Exception:
        return True


def cmd_doctor(args: argparse.Namespace) -> int:
    common.quiet_sglang()
    report = doctor_report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:

        def yn(v):
            return "yes" if v else ("unknown" if v is None else "no")

        missing = report["missing_fields"] or {}
        rows = [
            (
                "SGLang",
                f"{report['sglang_version'] or 'not installed'}"
                f" (supported: {', '.join(report['supported_range'])})",
            ),
            ("DSpark present", yn(report["dspark_present"])),
            ("entry point registered", yn(report["entry_point_registered"])),
            ("plugin loaded", yn(report["plugin_loaded"])),
            ("bug detected (probe)", yn(report["bug_detected"])),
            (
                "  DP-attention path missing",
                ", ".join(missing.get("dp_attention_path", [])) or "-",
            ),
            (
                "  attention-TP path missing",
                ", ".join(missing.get("attention_tp_path", [])) or "-",
            ),
        ]
        for st in report["repairs"]:
            rows.append((f"repair {st['repair']}", f"{st['outcome']}: {st['reason']}"))
        for ch in report["changes"]:
            rows.append(
                (
                    f"upstream {ch['label']}"
                    + ("" if ch["label"] == ch["change"] else f" {ch['change']}"),
                    f"{ch['state']} ({ch['repair']}): {ch['evidence']}",
                )
            )
        if not report["repairs"]:
            rows.append(("repairs", report["reason"] or "-"))
        rows.append(("draft-batch plan", report["repair"] or "-"))
        rows.append(
            ("guard (SGLANG_DSPARK_DP_CHECK)", "on" if report["guard"] else "off")
        )
        rows.append(_watch_row(report["watch"]))
        for site in report["watch"]["sites"]:
            watched = ", ".join(site["decisions"])
            rows.append(
                (
                    f"  watch site {site['site']}",
                    watched
                    if site["watchable"]
                    else f"unwatched on this build: {site['reason']}",
                )
            )
        w = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{w}}  {v}")
    if not report["dspark_present"]:
        return EXIT_CANNOT
    healthy = report["plugin_loaded"] and all(
        st["outcome"] in ("enabled", "not needed") for st in report["repairs"]
    )
    return EXIT_OK if healthy else EXIT_FAIL


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="report on the installed SGLang and the plugin")
    common.add_flag(d, "--json")
    d.set_defaults(func=cmd_doctor)
