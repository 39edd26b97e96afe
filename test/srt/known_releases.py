"""How each tested release's stock DSpark behaves: the suite's one table.

``dp``: the DP-attention draft batch misses fields (stock ``can_run_graph``
then crashes with ``expectations.KNOWN_CRASH``); ``local``: the attention-TP
draft batch misses the non-padded counts; ``blocks``: the stock DP fill,
though complete, makes the host wait for the GPU (a device tensor straight
from host data). The probe must find exactly this;
a release whose behaviour changes fails the suite instead of being silently
re-classified.
"""

from __future__ import annotations

KNOWN = {
    "0.5.16": {"dp": True, "local": True, "blocks": False},
    "0.5.17": {"dp": False, "local": True, "blocks": True},
    "0.5.18": {"dp": False, "local": True, "blocks": True},
    "0.5.23": {"dp": False, "local": False, "blocks": False},
}


def known(version: str):
    """The recorded behaviour of ``version`` (None: not recorded)."""
    return KNOWN.get(version)
