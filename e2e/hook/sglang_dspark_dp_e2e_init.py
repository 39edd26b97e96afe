"""e2e only: dummy weights at a real model's init scale, for ``--load-format
dummy`` servers of ``e2e/run_e2e.sh``. Never part of the plugin.

SGLang's dummy loader (``DummyModelLoader.load_model`` in
``model_loader/loader.py``) fills every floating-point weight from
U(-1e-3, 1e-3) with one fixed seed, so weights of the same shape are equal
(every layer alike) and every activation is close to zero: greedy output is
then a function of the last token alone and falls into a 2-token cycle, and
"identical greedy outputs" proves little. This hook, loaded through its own
entry point in the ``sglang.srt.plugins`` group (the dist-info beside this
file; ``run_e2e.sh`` puts this folder on ``PYTHONPATH``), replaces the name
that loader calls with :func:`init_like_a_real_model`:

* each weight is seeded from its own name, so layers differ;
* RMSNorm weights (1-D, named ``*norm.weight``) are 1, as a trained or
  freshly initialised model's are;
* every other floating-point entry is drawn from U(-r, r), r =
  ``SGLANG_DSPARK_DP_E2E_INIT_RANGE`` (default 0.035: a standard deviation
  of 0.02, the tiny configs' ``initializer_range``).

Deterministic: the same config gives the same weights in every server of a
run, which the greedy comparison across servers needs. It logs one line per
process that loads it (``sglang-dspark-dp-e2e: ...`` with the pid), which
``e2e_checks.py plugin-lines`` counts as the processes that load plugins.
"""

from __future__ import annotations

import logging
import os
import sys
import zlib

logger = logging.getLogger("sglang_dspark_dp_e2e_init")

RANGE_ENV = "SGLANG_DSPARK_DP_E2E_INIT_RANGE"
DEFAULT_RANGE = 0.035
SEED = 1234
LOG_PREFIX = "sglang-dspark-dp-e2e:"


def init_range() -> float:
    raw = os.environ.get(RANGE_ENV, "")
    if not raw:
        return DEFAULT_RANGE
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{RANGE_ENV}={raw!r} is not a number") from None
    if not 0 < value < 1:
        raise ValueError(f"{RANGE_ENV}={raw!r} must be in (0, 1)")
    return value


def is_norm_weight(name: str, tensor) -> bool:
    return tensor.dim() == 1 and name.endswith("norm.weight")


def init_like_a_real_model(model, low=None, high=None, seed: int = SEED, **_) -> None:
    """Takes what SGLang's ``initialize_dummy_weights`` takes; ``low`` and
    ``high`` are ignored in favour of the e2e range."""
    import torch

    r = init_range()
    for name, tensor in model.state_dict().items():
        if not torch.is_floating_point(tensor):
            continue
        if is_norm_weight(name, tensor):
            tensor.data.fill_(1.0)
            continue
        generator = torch.Generator(device=tensor.data.device)
        generator.manual_seed((seed + zlib.crc32(name.encode())) % (2**63))
        if torch.finfo(tensor.dtype).bits < 16:  # fp8: uniform_ needs >= 16 bits
            tmp = torch.empty_like(tensor.data, dtype=torch.float16)
            tmp.uniform_(-r, r, generator=generator)
            tensor.data.copy_(tmp.to(tensor.dtype))
        else:
            tensor.data.uniform_(-r, r, generator=generator)


def install() -> list[str]:
    """Replace the dummy init where the dummy loader looks it up; returns
    the modules patched."""
    from sglang.srt.model_loader import loader, weight_utils

    patched = []
    for module in (loader, weight_utils):
        if hasattr(module, "initialize_dummy_weights"):
            module.initialize_dummy_weights = init_like_a_real_model
            patched.append(module.__name__)
    return patched


def register() -> None:
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    try:
        patched = install()
        logger.info(
            "%s pid %d: dummy weights U(-%g, %g), norms 1, seeded per name (%s)",
            LOG_PREFIX,
            os.getpid(),
            init_range(),
            init_range(),
            ", ".join(patched),
        )
    except Exception as exc:
        logger.warning(
            "%s pid %d: not installed: %s: %s",
            LOG_PREFIX,
            os.getpid(),
            type(exc).__name__,
            exc,
        )
