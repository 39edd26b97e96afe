"""Write and read the matrix's result files and render them as a table and plot.

It owns the on-disk layout (``<out>/<name>/result.json``, ``matrix.json``):
:func:`write_json` stores a result atomically, :func:`load_results` reads them
back, :func:`render_markdown` builds the comparison table and
:func:`render_plot` the PNG (matplotlib is imported there, only when a plot is
drawn, so everything else works without it).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from .config import PROG

RESULT_FILE = "result.json"
MATRIX_FILE = "matrix.json"
REPORT_MD = "report.md"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """Every ``*/result.json`` under ``results_dir``, in the run's order."""
    found = []
    for path in sorted(results_dir.glob(f"*/{RESULT_FILE}")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"{PROG}: skipping unreadable {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(data, dict) and "name" in data:
            found.append(data)
    order = []
    try:
        order = json.loads((results_dir / MATRIX_FILE).read_text()).get("configs", [])
    except (OSError, json.JSONDecodeError, AttributeError):
        pass

    def key(r: dict[str, Any]) -> tuple:
        pos = order.index(r["name"]) if r["name"] in order else len(order)
        return (pos, r.get("order", 0), r["name"])

    return sorted(found, key=key)


def _bench_value(res: dict[str, Any], concurrency: int, name: str) -> float | None:
    for case in res.get("bench") or []:
        if case.get("concurrency") == concurrency and case.get("status") == "ok":
            return finite((case.get("result") or {}).get(name))
    return None


def report_rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list]]:
    """Column titles and per-config raw values (None = missing)."""
    concurrencies = sorted(
        {
            case["concurrency"]
            for r in results
            for case in r.get("bench") or []
            if isinstance(case.get("concurrency"), int)
        }
    )
    titles = ["GSM8K accuracy", "Invalid"]
    titles += [f"Output tok/s c{c}" for c in concurrencies]
    titles += [f"Median TPOT ms c{c}" for c in concurrencies]
    titles.append("Accept length")
    rows = []
    for r in results:
        g = r.get("gsm8k") or {}
        row = [finite(g.get("accuracy")), finite(g.get("invalid"))]
        row += [_bench_value(r, c, "output_throughput") for c in concurrencies]
        row += [_bench_value(r, c, "median_tpot_ms") for c in concurrencies]
        row.append(finite(r.get("accept_length")))
        rows.append(row)
    return titles, rows


def _digits(title: str) -> int:
    if title in ("GSM8K accuracy", "Invalid"):
        return 3
    if title.startswith("Output tok/s"):
        return 1
    return 2


def format_cell(value: float | None, base: float | None, digits: int) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    if base is not None and base != 0:
        text += f" ({value / base:.2f}x)"
    return text


def render_markdown(results: list[dict[str, Any]]) -> str:
    titles, rows = report_rows(results)
    lines = [
        "# DSpark x DP validation matrix",
        "",
        "Ratios are relative to the first configuration"
        + (f" (`{results[0]['name']}`)." if results else "."),
        "",
        "| Configuration | " + " | ".join(titles) + " |",
        "|---|" + "---:|" * len(titles),
    ]
    base = rows[0] if rows else []
    for r, row in zip(results, rows, strict=False):
        cells = [format_cell(v, base[i], _digits(titles[i])) for i, v in enumerate(row)]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    notes = [r for r in results if r.get("status") != "ok"]
    if notes:
        lines += ["", "Failures:", ""]
        for r in notes:
            lines.append(f"- `{r['name']}`: {r.get('status')}: {r.get('error')}")
    return "\n".join(lines) + "\n"


def render_plot(results: list[dict[str, Any]], path: Path) -> bool:
    """Bar charts of throughput and accuracy; False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    titles, rows = report_rows(results)
    names = [r["name"] for r in results]
    panels = [i for i, t in enumerate(titles) if t.startswith("Output tok/s")]
    panels.append(titles.index("GSM8K accuracy"))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.5 * len(panels), 4.0), squeeze=False
    )
    for ax, col in zip(axes[0], panels, strict=False):
        values = [row[col] if row[col] is not None else 0.0 for row in rows]
        bars = ax.bar(range(len(names)), values, color="tab:blue")
        for bar, row in zip(bars, rows, strict=False):
            label = (
                "n/a" if row[col] is None else f"{row[col]:.{_digits(titles[col])}f}"
            )
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.set_title(titles[col])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        if titles[col] == "GSM8K accuracy":
            ax.set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(results_dir: Path, output: Path | None = None) -> int:
    """Write the markdown table (and the PNG next to it); return an exit code."""
    results = load_results(results_dir)
    if not results:
        print(f"{PROG}: error: no */{RESULT_FILE} files under {results_dir}",
              file=sys.stderr)  # fmt: skip
        return 2
    md_path = output or results_dir / REPORT_MD
    md_path.write_text(render_markdown(results))
    print(f"Report written to {md_path}")
    png_path = md_path.with_suffix(".png")
    if render_plot(results, png_path):
        print(f"Plot written to {png_path}")
    else:
        print("matplotlib is not installed; plot skipped")
    return 0
