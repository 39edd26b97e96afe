"""Command line of the DSpark x DP validation matrix (``sglang-dspark-dp-matrix``).

For every ``[[config]]`` of a TOML file ``run`` starts the SGLang server, waits
for ``/health``, runs the GSM8K client in-process, runs ``sglang.bench_serving``
(as a subprocess, one case per concurrency), reads the speculative acceptance
length, stops the server (whole process group) and writes the raw results into
``<output-dir>/<name>/``. ``report`` then turns the recorded files into a
markdown table and a PNG plot.

    sglang-dspark-dp-matrix run --config matrix.toml --output-dir results/
    sglang-dspark-dp-matrix run --config matrix.toml --output-dir results/ --dry-run
    sglang-dspark-dp-matrix report --results-dir results/

The work lives in :mod:`.config` (the TOML file), :mod:`.supervision` (server
processes), :mod:`.measurement` (the numbers) and :mod:`.reporting` (result
files, table, plot); this module only parses the command line and loops.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .config import PROG, ConfigError, load_config
from .measurement import plan, run_one
from .reporting import MATRIX_FILE, REPORT_MD, write_json, write_report


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.only:
        wanted = set(args.only)
        unknown = wanted - {c.name for c in cfg.configs}
        if unknown:
            print(f"{PROG}: error: argument --only: unknown configuration(s) "
                  f"{', '.join(sorted(unknown))}", file=sys.stderr)  # fmt: skip
            return 2
        cfg.configs = [c for c in cfg.configs if c.name in wanted]
    out_root = Path(args.output_dir)
    if args.dry_run:
        print(plan(cfg, out_root))
        return 0
    out_root.mkdir(parents=True, exist_ok=True)
    index = {
        "config_file": str(Path(args.config).resolve()),
        "configs": [c.name for c in cfg.configs],
        "status": {},
    }
    write_json(out_root / MATRIX_FILE, index)

    # Turn SIGTERM into KeyboardInterrupt so the finally blocks stop the servers.
    def _on_term(signum, frame):
        raise KeyboardInterrupt

    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread
        previous = None
    code = 0
    try:
        for order, sc in enumerate(cfg.configs):
            res = run_one(cfg, sc, order, out_root)
            index["status"][sc.name] = res["status"]
            write_json(out_root / MATRIX_FILE, index)
            if res["status"] != "ok":
                code = 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; servers stopped, partial results kept in "
              f"{out_root}", file=sys.stderr)  # fmt: skip
        code = 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code != 130 and not args.no_report:
        write_report(out_root)
    return code


def cmd_report(args: argparse.Namespace) -> int:
    results_dir = Path(args.results_dir)
    if not results_dir.is_dir():
        print(f"{PROG}: error: results directory not found: {results_dir}",
              file=sys.stderr)  # fmt: skip
        return 2
    return write_report(results_dir, Path(args.output) if args.output else None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="DSpark x DP validation matrix: launch, measure "
        "and compare server configurations."
    )  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="launch and measure every configuration")
    r.add_argument("--config", required=True, help="TOML matrix config")
    r.add_argument("--output-dir", required=True, help="folder for raw results")
    r.add_argument("--only", nargs="+", metavar="NAME", help="run only these configs")
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands that would run, launch nothing",
    )
    r.add_argument("--no-report", action="store_true",
                   help="do not write the report after the run")  # fmt: skip
    r.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="table + plot from recorded results")
    rep.add_argument("--results-dir", required=True)
    rep.add_argument("--output", default=None,
                     help=f"markdown path (default: RESULTS_DIR/{REPORT_MD}; "
                          "the PNG goes next to it)")  # fmt: skip
    rep.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
