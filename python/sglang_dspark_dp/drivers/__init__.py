"""CPU drivers of real SGLang objects: proposers, batches, graph admission.

Used by the probe, the regression suite, the harnesses and the benchmarks,
so all of them exercise the same installed code. Never imports a repair.
"""

#: Draft block width (gamma) every driver-based check uses by default.
DRAFT_WIDTH = 4
#: ``--cuda-graph-max-bs-decode`` the checks assume (SGLang's default).
MAX_CAPTURE_BS = 128
