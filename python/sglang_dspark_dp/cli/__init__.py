"""``sglang-dspark-dp``, the plugin's command line: one module per command,
each with its ``add_parser`` (:data:`COMMANDS`); the user reads
:data:`DESCRIPTION` in ``--help``.

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

#: What ``sglang-dspark-dp --help`` tells its user.
DESCRIPTION = (
    "Check the sglang-dspark-dp plugin, which keeps the ranks of a DSpark "
    "server (DP attention, TP) taking the same decisions, and find out why a "
    "DSpark server hangs. Run it in the Python the server runs in: doctor says "
    "what the plugin does on this SGLang; verify drives this SGLang's DSpark "
    "code with simulated ranks on CPU and checks that they agree (--no-fix: "
    "stock SGLang); diverge --explain DUMP_DIR reads a hung server's "
    "flight-recorder dumps and names where its ranks parted; judge judges "
    "this SGLang build alone, one verdict per upstream change; repro shows "
    "one DP step, stock and repaired."
)
EPILOG = (
    "Exit status: 0 all is well, 1 a problem found (named), 2 cannot run here "
    "(one line says why). Each command's --help lists its options; README.md "
    "and docs/ have the rest."
)


def build_parser() -> Parser:
    p = Parser(prog="sglang-dspark-dp", description=DESCRIPTION, epilog=EPILOG)
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
