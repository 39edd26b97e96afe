"""Make ``sglang_dspark_dp_bench`` importable without installing the repo.

The package maps to the ``benchmark/`` folder (see pyproject.toml). When the repo
is installed (``pip install -e .``) the real mapping is used; otherwise the
folder is registered under that name here, so these tests also run from a bare
checkout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _register_bench_package() -> None:
    try:
        import sglang_dspark_dp_bench  # noqa: F401

        return
    except ImportError:
        pass
    folder = REPO_ROOT / "benchmark"
    spec = importlib.util.spec_from_file_location(
        "sglang_dspark_dp_bench",
        folder / "__init__.py",
        submodule_search_locations=[str(folder)],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["sglang_dspark_dp_bench"] = module
    spec.loader.exec_module(module)


_register_bench_package()
