"""SGLang's ``SpecTpSync`` (0.5.19 on): its startup memory reading, its sync
sites and the ``SGLANG_SPEC_TP_SYNC`` setting that selects them.

``SpecTpSync.available_memory_gb(site, device, gpu_id, *, group)`` is the
reading the DSpark worker's capture decision (and, on 0.5.19-0.5.21, its
folded-sampling decision) takes at startup, passing the draft capture group
as ``group``. The installed method reduces over ``group`` only where the
instance's own sites are on, and an instance built on a one-rank group has
none. SGLang is imported at call time.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

from sglang_dspark_dp.adapter.base import dspark_class
from sglang_dspark_dp.adapter.modules import SYNC_MODULE
from sglang_dspark_dp.outcome import DidNotEnable

SYNC = "SpecTpSync"
SITES = "SpecTpSyncSite"
READING = "available_memory_gb"
#: The capture-group-memory repair's hook target (``HookRegistry`` spelling).
READING_TARGET = f"{SYNC_MODULE}.{SYNC}.{READING}"
#: ``available_memory_gb``'s parameters after ``self`` (``group`` keyword-only).
READING_PARAMS = ("site", "device", "gpu_id", "group")
#: The setting that selects the sync sites, and SGLang's parser of it.
SETTING = "SGLANG_SPEC_TP_SYNC"
PARSER = "parse_spec_tp_sync"
#: The value of the setting with every site on (SGLang's default).
EVERY_SITE = "all"
#: The site of the DSpark draft's startup reading.
DSPARK_MEMORY_SITE = "DSPARK_MEM"
#: What the installed module calls SGLang's free-memory helper.
MEMORY_HELPER = "get_available_gpu_memory"


def load_sync() -> tuple[Any, type]:
    """``(spec_tp_sync module, SpecTpSync)``, or DidNotEnable where the
    release has none (0.5.16-0.5.18) or its reading looks different."""
    module, cls = dspark_class(SYNC_MODULE, SYNC, "TP sync")
    fn = cls.__dict__.get(READING)
    if not callable(fn):
        raise DidNotEnable(f"{SYNC}.{READING} is not there (renamed target?)")
    params = inspect.signature(inspect.unwrap(fn)).parameters
    names = [p for p in params if p != "self"]
    if tuple(names) != READING_PARAMS or (
        params["group"].kind is not inspect.Parameter.KEYWORD_ONLY
    ):
        raise DidNotEnable(
            f"{SYNC}.{READING} has an unexpected signature ({', '.join(params)})"
        )
    for name in (SITES, PARSER, MEMORY_HELPER):
        if not hasattr(module, name):
            raise DidNotEnable(f"{SYNC_MODULE} has no {name} (renamed?)")
    return module, cls


def stock_reading(cls: type) -> Any:
    """``available_memory_gb`` as the installed SGLang wrote it, under any
    hook ``HookRegistry`` applied."""
    return inspect.unwrap(cls.__dict__[READING])


def reading_signature(cls: type) -> inspect.Signature:
    return inspect.signature(stock_reading(cls))


def memory_site(module: Any) -> Any:
    """The ``SpecTpSyncSite`` member of the DSpark draft's startup reading."""
    return getattr(getattr(module, SITES), DSPARK_MEMORY_SITE)


def site_name(site: Any) -> str:
    """A site's name as the setting spells it (``dspark-mem``)."""
    slug = getattr(site, "slug", None)
    return str(slug) if slug else str(getattr(site, "name", site))


def _setting() -> Any:
    return getattr(importlib.import_module("sglang.srt.environ").envs, SETTING)


def setting_value() -> str:
    """``SGLANG_SPEC_TP_SYNC`` as SGLang reads it."""
    return str(_setting().get())


def configured_sites(module: Any) -> frozenset[Any]:
    """The sites ``SGLANG_SPEC_TP_SYNC`` selects, parsed by SGLang, whatever
    size of group an instance was built on."""
    return frozenset(getattr(module, PARSER)(setting_value()))


@contextlib.contextmanager
def every_site() -> Iterator[None]:
    """For a ``with`` block: ``SGLANG_SPEC_TP_SYNC`` at SGLang's default
    (every site on), whatever the process set."""
    with _setting().override(EVERY_SITE):
        yield


def memory_helper(module: Any) -> Any:
    """The free-memory helper as the installed module looks it up now (so a
    ``mock.patch`` on the module's name reaches it)."""
    return getattr(module, MEMORY_HELPER)
