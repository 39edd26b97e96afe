"""How each tested release's stock DSpark behaves: the suite's one table.

``dp``: the DP-attention draft batch misses fields (stock ``can_run_graph``
then crashes with ``expectations.KNOWN_CRASH``); ``local``: the attention-TP
draft batch misses the non-padded counts; ``blocks``: the stock DP fill,
though complete, makes the host wait for the GPU (a device tensor straight
from host data); ``startup_tp`` / ``startup_dp``: stock ranks can disagree
on the draft CUDA-graph capture at startup under plain TP / DP attention
(0.5.23 plain TP reduces through ``SpecTpSync`` already). The probes must
find exactly this;
a release whose behaviour changes fails the suite instead of being silently
re-classified.
"""

from __future__ import annotations

KNOWN = {
    "0.5.16": {
        "dp": True,
        "local": True,
        "blocks": False,
        "startup_tp": True,
        "startup_dp": True,
    },
    "0.5.17": {
        "dp": False,
        "local": True,
        "blocks": True,
        "startup_tp": True,
        "startup_dp": True,
    },
    "0.5.18": {
        "dp": False,
        "local": False,
        "blocks": True,
        "startup_tp": True,
        "startup_dp": True,
    },
    "0.5.23": {
        "dp": False,
        "local": False,
        "blocks": False,
        "startup_tp": False,
        "startup_dp": True,
    },
}


def known(version: str):
    """The recorded behaviour of ``version`` (None: not recorded)."""
    return KNOWN.get(version)
