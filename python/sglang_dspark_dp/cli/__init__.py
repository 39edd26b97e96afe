"""``sglang-dspark-dp``: one module per command.

* ``verify``  the main job: simulated ranks (one process each, gloo over
  loopback) drive the real DSpark code and must take the same decisions.
* ``doctor``  is the installed SGLang healthy, and what did the plugin do?
* ``judge``   the installed SGLang build alone (plugin off), one verdict per
  upstream change, for maintainers who cherry-pick onto a release branch.
* ``repro``   one DP step on stock SGLang and with the repair, side by side.
* ``diverge`` perturbed simulated ranks, PyTorch's flight recorder, and the
  first collective on which they part, named by site and upstream change.
"""

from __future__ import annotations

import json
import sys

from sglang_dspark_dp.cli import diverge, doctor, judge, repro, verify
from sglang_dspark_dp.cli.common import EXIT_CANNOT, Parser, err

COMMANDS = (verify, doctor, judge, repro, diverge)


def build_parser() -> Parser:
    p = Parser(prog="sglang-dspark-dp", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help()
        return EXIT_CANNOT
    from sglang_dspark_dp.package import missing_runtime

    missing = missing_runtime()  # the wrong venv: say so, no traceback
    if missing is not None:
        if getattr(args, "json", False):
            print(json.dumps({"dspark_present": False, "reason": missing}))
        err(f"cannot run {args.cmd}: {missing}")
        return EXIT_CANNOT
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
