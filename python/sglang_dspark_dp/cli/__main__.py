"""``python -m sglang_dspark_dp.cli``: the ``sglang-dspark-dp`` command."""

import sys

from sglang_dspark_dp.cli import main

sys.exit(main())
