"""SGLang plugin that repairs the DP-attention / EP metadata of DSpark's
hand-built draft ``ForwardBatch`` on affected SGLang releases."""

from sglang_dspark_dp.package import __version__

__all__ = ["__version__"]
