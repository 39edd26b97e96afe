"""e2e only: stands in for Hugging Face ``datasets`` in the bench process.

``sglang.benchmark.serving`` imports ``sglang.benchmark.datasets``, whose
MMMU loader does ``from datasets import load_dataset`` at import time. The
device has no ``datasets`` and the e2e bench (``--dataset-name random-ids``)
loads none, so ``run_e2e.sh`` puts this folder first on the bench's
``PYTHONPATH`` only (never the servers'); anything that does call
``load_dataset`` fails, naming why.
"""


def load_dataset(*args, **kwargs):
    raise RuntimeError(
        "datasets is not installed for the e2e bench (e2e/bench_shim): "
        "use a data set that needs no download, e.g. --dataset-name random-ids"
    )
