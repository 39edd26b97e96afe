"""The README's and docs/'s commands stay in step with the CLI's parsers.

Every ``sglang-dspark-dp COMMAND --flag`` written in README.md or
docs/*.md (in a code block, a code span, or a code span that starts with a
command's name, as ``verify --no-fix``) names a command the CLI has and flags
that command's parser takes; a bare ```--flag``` span under a heading that
names a command (``### `sglang-dspark-dp verify ...` ``) is that command's.
Every command of the CLI is mentioned somewhere. The parsers are built
without SGLang (``sglang_dspark_dp.cli.build_parser``), so this runs
anywhere; and the top-level ``--help`` describes the tool, not its modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re

from sglang_dspark_dp.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

TOOL = "sglang-dspark-dp"
#: ``sglang-dspark-dp WORD``: not ``sglang-dspark-dp:`` (a log line) nor
#: ``sglang-dspark-dp-gsm8k`` (another tool) nor ``sglang-dspark-dp[diverge]``.
CALL = re.compile(rf"(?<![\w/-]){re.escape(TOOL)}\s+([a-z][\w-]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
HEADING = re.compile(r"^#{1,6} (.*)$", re.M)


@dataclasses.dataclass(frozen=True)
class Mention:
    page: str
    line: int
    command: str
    flags: tuple[str, ...]
    text: str

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text!r}"


def cli_commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _calls(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(command, flags)`` for each ``sglang-dspark-dp COMMAND ...`` in one
    piece of code: its flags run up to the next call."""
    found = list(CALL.finditer(text))
    out = []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out.append((m.group(1), tuple(FLAG.findall(text[m.end() : end]))))
    return out


def mentions(path: pathlib.Path, known: set[str]) -> list[Mention]:
    """Every command mention in one page, with the flags given with it."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    out: list[Mention] = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    # Code blocks: each line (continuations joined), comments dropped.
    for block in FENCE.finditer(text):
        body = block.group(1).replace("\\\n", " ")
        for offset, line in enumerate(body.splitlines()):
            code = re.split(r"\s#\s", line, maxsplit=1)[0]
            for command, flags in _calls(code):
                out.append(
                    Mention(
                        page, line_of(block.start(1)) + offset, command, flags, line
                    )
                )
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)

    # The heading each position is under, and the command it names, if any.
    heads = [(m.start(), m.group(1)) for m in HEADING.finditer(prose)]

    def heading_command(pos: int) -> str | None:
        under = [h for start, h in heads if start < pos]
        if not under:
            return None
        called = _calls(" ".join(SPAN.findall(under[-1])))
        return called[0][0] if called else None

    for span in SPAN.finditer(prose):
        code = " ".join(span.group(1).split())
        line = line_of(span.start())
        called = _calls(code)
        if called:
            out.extend(Mention(page, line, c, f, code) for c, f in called)
            continue
        first, _, rest = code.partition(" ")
        if first in known and FLAG.search(rest):
            out.append(Mention(page, line, first, tuple(FLAG.findall(rest)), code))
        elif first.startswith("--") and FLAG.fullmatch(first):
            command = heading_command(span.start())
            if command is not None:
                out.append(Mention(page, line, command, (first,), code))
    return out


def all_mentions() -> list[Mention]:
    known = set(cli_commands())
    return [m for path in PAGES for m in mentions(path, known)]


def test_pages_exist():
    assert (ROOT / "README.md").is_file()
    names = {p.name for p in PAGES}
    assert {"maintainers.md", "diverge.md", "benchmarks.md", "development.md"} <= names


def test_every_documented_command_and_flag_is_in_the_cli():
    commands = cli_commands()
    found = all_mentions()
    assert len(found) > 20, "the pages' commands were not found at all"
    wrong = []
    for m in found:
        parser = commands.get(m.command)
        if parser is None:
            wrong.append(f"{m.where()}: no command {m.command!r} in {TOOL}")
            continue
        for flag in m.flags:
            if flag not in parser._option_string_actions:
                wrong.append(f"{m.where()}: {TOOL} {m.command} has no {flag}")
    assert not wrong, "\n".join(wrong)


def test_every_cli_command_is_documented():
    mentioned = {m.command for m in all_mentions()}
    missing = sorted(set(cli_commands()) - mentioned)
    assert not missing, f"{TOOL} commands no page mentions: {missing}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub's anchors for a page's headings (lower case, punctuation but
    ``-`` and ``_`` dropped, spaces as ``-``)."""
    text = FENCE.sub("", path.read_text())
    out = set()
    for heading in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        out.add(slug.replace(" ", "-"))
    return out


def test_every_link_between_the_pages_resolves():
    """Relative links (the pages moved into docs/) reach a file, and an
    anchor reaches a heading of that page."""
    wrong = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                wrong.append(f"{where}: no {dest}")
            elif anchor and anchor not in anchors(dest):
                wrong.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not wrong, "\n".join(wrong)


def test_top_level_help_describes_the_tool():
    text = " ".join(build_parser().format_help().split())
    assert "module" not in text, text
    for word in ("DSpark", "plugin", "doctor", "verify", "diverge --explain"):
        assert word in text, (word, text)
