"""The DSpark draft-batch repair and its hook.

Counterpart of ``sglang/srt/speculative/dspark_components/dspark_draft.py``
(``DraftBlockProposer``, which the DSpark worker owns). The proposer builds
its draft ``ForwardBatch`` by hand in ``_run_forward`` (ranks with requests)
and ``run_idle_participation`` (ranks without), and both hand it to
``_fill_dp_moe_sync_metadata`` for the DP/EP fields. That fill is the one
hook target.

Nothing is decided by version string: :func:`probe` runs the installed stock
fill once on a tiny CPU batch (EP forced to 2 through SGLang's own
``get_parallel().override``), on the DP-attention path and on the
attention-TP path, and reports which fields come back missing or wrong. Only
those are repaired; where nothing is missing nothing is patched.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from types import SimpleNamespace
from typing import Any

import torch

from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
    ALL_GROUPS,
    NON_PADDED,
    UNSCALED,
    DraftDPBuffers,
    DraftDPFieldNames,
    derive_draft_dp_metadata,
)
from sglang_dspark_dp.srt.runtime_context import parallel_override

logger = logging.getLogger("sglang_dspark_dp")

DRAFT_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"
PROPOSER = "DraftBlockProposer"
FILL = "_fill_dp_moe_sync_metadata"
TARGET = f"{DRAFT_MODULE}.{PROPOSER}.{FILL}"

#: Environment variable that turns the runtime guard on (read at instrument
#: time, so an off guard costs nothing per step).
GUARD_ENV = "SGLANG_DSPARK_DP_CHECK"

_BUFFERS_ATTR = "_sglang_dspark_dp_buffers"

# Arguments newer DraftBlockProposer.__init__ signatures require that the
# fill does not depend on; the probe and the harness pass these.
_INIT_FILLERS: dict[str, Any] = {
    "tp_sync": None,
    "random_seed": 0,
    "greedy_draft": True,
}


class DidNotEnable(Exception):  # noqa: N818 - the name Sentry's integrations use
    """The repair cannot apply to the installed SGLang; the message says why."""


# --------------------------------------------------------------------------
# Access to the installed SGLang (imports are deferred to call time so that
# importing this package never imports SGLang).
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SGLangAPI:
    """The handful of installed SGLang objects the repair works with."""

    proposer_cls: type
    forward_batch_cls: type
    schedule_batch_cls: type
    forward_mode: Any
    capture_hidden_mode: Any
    spec_algorithm: Any
    get_parallel: Any
    make_spec_info: Any
    draft_module: Any
    fbi_module: Any
    spec_module: Any

    # SGLang functions the fill calls are looked up at call time, where the
    # stock fill looks them up (the draft module's namespace where it
    # imports them, else their home module), so a ``mock.patch`` in SGLang's
    # own unit-test style, or another plugin's hook, reaches the repair too.

    def enable_num_token_non_padded(self) -> bool:
        fn = getattr(self.draft_module, "enable_num_token_non_padded", None)
        if fn is None:
            fn = self.fbi_module.enable_num_token_non_padded
        return bool(fn())

    def scale(self, spec_info: Any, counts: Any, logprob_counts: Any) -> Any:
        fn = getattr(self.draft_module, "spec_scale_global_num_tokens", None)
        if fn is None:
            fn = self.spec_module.spec_scale_global_num_tokens
        return fn(spec_info, counts, logprob_counts)


def load_sglang_api() -> SGLangAPI:
    """Import what the repair needs, or raise :class:`DidNotEnable`."""
    import importlib

    try:
        importlib.import_module("sglang")
    except ImportError as exc:
        raise DidNotEnable(f"sglang is not importable ({exc})") from exc
    try:
        draft = importlib.import_module(DRAFT_MODULE)
    except ImportError as exc:
        raise DidNotEnable(
            f"the installed SGLang has no DSpark draft module {DRAFT_MODULE} ({exc})"
        ) from exc
    proposer_cls = getattr(draft, PROPOSER, None)
    if not isinstance(proposer_cls, type):
        raise DidNotEnable(f"{DRAFT_MODULE} has no class {PROPOSER}")
    for attr in (FILL, "_run_forward", "run_idle_participation"):
        if not callable(getattr(proposer_cls, attr, None)):
            raise DidNotEnable(f"{PROPOSER}.{attr} is not there (renamed target?)")
    params = list(inspect.signature(getattr(proposer_cls, FILL)).parameters)
    if params != ["self", "forward_batch", "batch"]:
        raise DidNotEnable(
            f"{PROPOSER}.{FILL} has an unexpected signature ({', '.join(params)})"
        )
    try:
        fbi = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
        sb = importlib.import_module("sglang.srt.managers.schedule_batch")
        spec = importlib.import_module("sglang.srt.speculative.spec_info")
        rc = importlib.import_module("sglang.srt.runtime_context")
        dwc = importlib.import_module("sglang.srt.speculative.draft_worker_common")
        # Resolved at call time (see SGLangAPI); here only checked present.
        fbi.enable_num_token_non_padded  # noqa: B018
        spec.spec_scale_global_num_tokens  # noqa: B018
        return SGLangAPI(
            proposer_cls=proposer_cls,
            forward_batch_cls=fbi.ForwardBatch,
            schedule_batch_cls=sb.ScheduleBatch,
            forward_mode=fbi.ForwardMode,
            capture_hidden_mode=fbi.CaptureHiddenMode,
            spec_algorithm=spec.SpeculativeAlgorithm,
            get_parallel=rc.get_parallel,
            make_spec_info=dwc.make_draft_block_spec_info,
            draft_module=draft,
            fbi_module=fbi,
            spec_module=spec,
        )
    except (ImportError, AttributeError) as exc:
        raise DidNotEnable(
            f"an SGLang API the repair needs is missing ({exc})"
        ) from exc


# --------------------------------------------------------------------------
# Building real proposers and draft batches (probe, harness, tests, bench).
# --------------------------------------------------------------------------


def build_draft_proposer(
    api: SGLangAPI,
    *,
    draft_model_runner: Any,
    gamma: int,
    dp_moe_sync: bool,
    draft_model: Any = None,
    mask_token_id: int = 0,
    spec_info: Any = None,
) -> Any:
    """A real ``DraftBlockProposer`` wired to ``draft_model_runner``.

    Arguments that newer signatures add and the DP fill does not use are
    given neutral values; an unknown required argument is a
    :class:`DidNotEnable` naming it.
    """
    if spec_info is None:
        spec_info = api.make_spec_info(
            draft_token_num=gamma, device=draft_model_runner.device
        )
    if draft_model is None:
        draft_model = SimpleNamespace(
            sample_from_anchor=True, forward_embed=None, confidence_head=None
        )
    kwargs: dict[str, Any] = dict(
        draft_model=draft_model,
        draft_model_runner=draft_model_runner,
        gamma=gamma,
        mask_token_id=mask_token_id,
        draft_block_spec_info=spec_info,
        dp_moe_sync=dp_moe_sync,
    )
    sig = inspect.signature(api.proposer_cls.__init__)
    for name, param in sig.parameters.items():
        if name == "self" or name in kwargs:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in _INIT_FILLERS:
            kwargs[name] = _INIT_FILLERS[name]
        elif param.default is param.empty:
            raise DidNotEnable(
                f"{PROPOSER}.__init__ requires an unexpected argument {name!r}"
            )
    missing = [k for k in kwargs if k not in sig.parameters]
    if missing and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        raise DidNotEnable(f"{PROPOSER}.__init__ no longer takes {missing}")
    return api.proposer_cls(**kwargs)


def make_schedule_batch(
    api: SGLangAPI,
    *,
    seq_lens: torch.Tensor,
    global_num_tokens: list[int] | None,
    can_run_dp_cuda_graph: bool = True,
) -> Any:
    """A real ``ScheduleBatch`` carrying what the draft path reads."""
    batch = api.schedule_batch_cls(reqs=[])
    bs = int(seq_lens.numel())
    batch.seq_lens = seq_lens
    batch.seq_lens_cpu = seq_lens.cpu()
    batch.req_pool_indices = torch.arange(bs, dtype=torch.int64, device=seq_lens.device)
    batch.global_num_tokens = global_num_tokens
    batch.global_num_tokens_for_logprob = (
        None if global_num_tokens is None else list(global_num_tokens)
    )
    batch.can_run_dp_cuda_graph = can_run_dp_cuda_graph
    if hasattr(batch, "can_run_decode_cuda_graph"):
        batch.can_run_decode_cuda_graph = can_run_dp_cuda_graph
    return batch


def make_draft_forward_batch(
    api: SGLangAPI, *, bs: int, width: int, spec_info: Any, device: Any
) -> Any:
    """A real ``ForwardBatch`` shaped like the hand-built draft batch."""
    n = bs * width
    ids = torch.zeros((n,), dtype=torch.int64, device=device)
    seq_lens = torch.full((bs,), 8, dtype=torch.int64, device=device)
    return api.forward_batch_cls(
        forward_mode=(api.forward_mode.TARGET_VERIFY if bs else api.forward_mode.IDLE),
        batch_size=bs,
        input_ids=ids,
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        out_cache_loc=ids.clone(),
        seq_lens_sum=8 * bs,
        seq_lens_cpu=seq_lens.cpu(),
        positions=ids.clone(),
        spec_algorithm=api.spec_algorithm.DSPARK,
        spec_info=spec_info,
        capture_hidden_mode=api.capture_hidden_mode.NULL,
    )


# --------------------------------------------------------------------------
# The probe.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What the installed stock fill leaves missing, per path."""

    names: DraftDPFieldNames
    missing_dp: tuple[str, ...]  # ForwardBatch fields, DP-attention path
    missing_local: tuple[str, ...]  # ForwardBatch fields, attention-TP path
    replaceable: bool  # the stock DP fill sets nothing beyond what we derive
    foreign_fields: tuple[str, ...]  # fields the stock DP fill sets besides ours

    @property
    def affected(self) -> bool:
        return bool(self.missing_dp or self.missing_local)

    def groups(self, missing: tuple[str, ...]) -> frozenset[str]:
        n = self.names
        out = set()
        if n.unscaled in missing:
            out.add(UNSCALED)
        if n.non_padded in missing or n.non_padded_cpu in missing:
            out.add(NON_PADDED)
        return frozenset(out)


class _ProbeRunner:
    """The least a draft runner must be for the fill alone: a device."""

    def __init__(self, device: Any) -> None:
        self.device = device


def _snapshot(fb: Any) -> dict[str, Any]:
    return {f.name: getattr(fb, f.name) for f in dataclasses.fields(fb)}


def _gaps(seen: Any, names: DraftDPFieldNames, *, dp: bool, counts, tokens) -> list:
    fields = seen.fields
    gaps = []
    if dp and fields.get("unscaled") != counts:
        gaps.append(names.unscaled)
    dtype, _device, value = fields.get("non_padded") or (None, None, None)
    if dtype != torch.int32 or value != tokens:
        gaps.append(names.non_padded)
    if fields.get("non_padded_cpu") != tokens:
        gaps.append(names.non_padded_cpu)
    return gaps


def probe(api: SGLangAPI | None = None) -> ProbeResult:
    """Build draft batches with the installed stock builder; report the gaps.

    The real ``DraftBlockProposer`` builds a tiny CPU batch on the busy path
    (and, under DP attention, the idle path) with EP forced to 2, for a DP
    attention topology (2 DP ranks) and an attention-TP one (1 DP rank,
    attention TP 2). Raises :class:`DidNotEnable` if the installed classes
    cannot even be driven that way (renamed fields, unexpected signatures).
    """
    from sglang_dspark_dp.drive import DraftDriver

    api = api or load_sglang_api()
    names = DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)
    absent = names.missing("unscaled", "non_padded", "non_padded_cpu")
    if absent:
        raise DidNotEnable(
            f"ForwardBatch declares no {', '.join(absent)} field (renamed?)"
        )
    stock = getattr(api.proposer_cls, FILL)
    stock = getattr(stock, "__wrapped__", stock)
    missing: dict[bool, list[str]] = {True: [], False: []}
    foreign: tuple[str, ...] = ()
    try:
        for dp in (True, False):
            # DP attention: 2 DP ranks x 1 attention-TP rank; attention TP:
            # 1 DP rank x 2 attention-TP ranks. EP 2 in both.
            topology = (
                dict(dp_size=2, attn_tp_size=1)
                if dp
                else dict(dp_size=1, attn_tp_size=2)
            )
            with parallel_override(api.get_parallel, ep_size=2, **topology):
                driver = DraftDriver(api, gamma=2, dp_moe_sync=dp, names=names)
                counts = [2, 0] if dp else [2]
                busy = driver.step(2, counts)
                found = _gaps(
                    busy, names, dp=dp, counts=counts, tokens=2 * driver.width
                )
                if dp:
                    idle = driver.step(0, counts)
                    if idle is not None:
                        found += _gaps(idle, names, dp=dp, counts=counts, tokens=0)
                    # Which fields does the stock fill itself set?
                    fb = busy.forward_batch
                    for name in ("unscaled", "non_padded", "non_padded_cpu"):
                        setattr(fb, getattr(names, name), None)
                    batch = make_schedule_batch(
                        api,
                        seq_lens=torch.full((2,), 8, dtype=torch.int64),
                        global_num_tokens=list(counts),
                    )
                    probe_proposer = build_draft_proposer(
                        api,
                        draft_model_runner=_ProbeRunner("cpu"),
                        gamma=2,
                        dp_moe_sync=True,
                    )
                    before = _snapshot(fb)
                    stock(probe_proposer, fb, batch)
                    after = _snapshot(fb)
                    ours = {getattr(names, f.name) for f in dataclasses.fields(names)}
                    foreign = tuple(
                        sorted(
                            k
                            for k in after
                            if k not in ours and after[k] is not before[k]
                        )
                    )
                missing[dp] = list(dict.fromkeys(found))
    except DidNotEnable:
        raise
    except Exception as exc:  # the installed code could not be driven
        raise DidNotEnable(
            f"probing the stock DSpark draft batch failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    scaled_present = not names.missing(
        "scaled_cpu",
        "scaled_gpu",
        "scaled_logprob_cpu",
        "scaled_logprob_gpu",
        "dp_graph_ok",
    )
    return ProbeResult(
        names=names,
        missing_dp=tuple(missing[True]),
        missing_local=tuple(missing[False]),
        replaceable=scaled_present and not foreign,
        foreign_fields=foreign,
    )


# --------------------------------------------------------------------------
# The hook.
# --------------------------------------------------------------------------


def proposer_buffers(proposer: Any, api: SGLangAPI) -> DraftDPBuffers:
    """The proposer's persistent buffers, made on its first step."""
    buffers = proposer.__dict__.get(_BUFFERS_ATTR)
    if buffers is None:
        buffers = DraftDPBuffers(
            proposer.draft_model_runner.device,
            with_non_padded=bool(api.enable_num_token_non_padded()),
        )
        proposer.__dict__[_BUFFERS_ATTR] = buffers
    return buffers


@dataclasses.dataclass(frozen=True)
class RepairPlan:
    """What the hook does on each path, fixed at instrument time."""

    dp_groups: frozenset[str]
    dp_calls_stock: bool
    local_groups: frozenset[str]
    guard: bool

    @classmethod
    def from_probe(cls, result: ProbeResult, *, guard: bool) -> RepairPlan:
        dp_groups = result.groups(result.missing_dp)
        dp_calls_stock = True
        if dp_groups and result.replaceable:
            # The stock fill is broken and sets nothing we do not derive:
            # replace it whole, so the step pays for one fill, not two (and
            # none of the stock fill's per-step device allocations).
            dp_groups, dp_calls_stock = ALL_GROUPS, False
        return cls(
            dp_groups=dp_groups,
            dp_calls_stock=dp_calls_stock,
            local_groups=result.groups(result.missing_local),
            guard=guard,
        )

    @property
    def patches(self) -> bool:
        return bool(self.dp_groups or self.local_groups or self.guard)

    def describe(self) -> str:
        def fmt(groups: frozenset[str]) -> str:
            return "+".join(sorted(groups)) or "untouched"

        dp = fmt(self.dp_groups)
        if self.dp_groups and not self.dp_calls_stock:
            dp = "replaced (" + dp + ")"
        return f"DP-attention path: {dp}; attention-TP path: {fmt(self.local_groups)}"


def make_fill_hook(plan: RepairPlan, names: DraftDPFieldNames, api: SGLangAPI):
    """The AROUND hook for ``DraftBlockProposer._fill_dp_moe_sync_metadata``."""
    from sglang_dspark_dp.srt.speculative.dspark_dp_guard import check_draft_batch

    dp_groups, local_groups = plan.dp_groups, plan.local_groups
    dp_calls_stock, guard = plan.dp_calls_stock, plan.guard
    scale = api.scale  # a method resolving SGLang's function per call

    def dspark_dp_fill(original, proposer, forward_batch, batch):
        dp = proposer._dp_moe_sync
        if not dp or dp_calls_stock:
            original(proposer, forward_batch, batch)
        groups = dp_groups if dp else local_groups
        if groups:
            derive_draft_dp_metadata(
                forward_batch,
                batch,
                spec_info=proposer._draft_block_spec_info,
                dp_moe_sync=dp,
                buffers=proposer_buffers(proposer, api),
                groups=groups,
                names=names,
                scale=scale,
            )
        if guard:
            check_draft_batch(proposer, forward_batch, batch, names=names, api=api)

    return dspark_dp_fill


# --------------------------------------------------------------------------
# instrument / uninstrument (symmetric, idempotent).
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _State:
    hook: Any = None
    original: Any = None
    plan: RepairPlan | None = None
    probe: ProbeResult | None = None
    reason: str = "not instrumented"


_STATE = _State()


_GUARD_ON = frozenset({"1", "true", "yes", "on"})
_GUARD_OFF = frozenset({"", "0", "false", "no", "off"})
_guard_warned: set[str] = set()


def guard_enabled() -> bool:
    """Whether ``SGLANG_DSPARK_DP_CHECK`` turns the guard on. A value that is
    neither on nor off means off, and says so once per process."""
    raw = os.environ.get(GUARD_ENV, "")
    value = raw.strip().lower()
    if value in _GUARD_ON:
        return True
    if value not in _GUARD_OFF and raw not in _guard_warned:
        _guard_warned.add(raw)
        logger.warning(
            "sglang-dspark-dp: %s=%r is neither on (1/true/yes/on) nor off "
            "(0/false/no/off); the guard stays off",
            GUARD_ENV,
            raw,
        )
    return False


def is_instrumented() -> bool:
    return _STATE.hook is not None


def state() -> _State:
    return _STATE


def instrument(*, apply: bool = True, guard: bool | None = None) -> RepairPlan:
    """Probe, then register the hook with SGLang's ``HookRegistry``.

    ``apply=False`` only registers (``load_plugins()`` applies every
    plugin's hooks itself once all have registered). Returns the plan;
    raises :class:`DidNotEnable` if the repair cannot apply. Calling it again
    while instrumented returns the current plan.
    """
    if _STATE.hook is not None:
        return _STATE.plan  # type: ignore[return-value]
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as exc:
        raise DidNotEnable(f"the installed SGLang has no plugin API ({exc})") from exc
    api = load_sglang_api()
    result = probe(api)
    plan = RepairPlan.from_probe(
        result, guard=guard_enabled() if guard is None else guard
    )
    _STATE.probe = result
    _STATE.plan = plan
    if not plan.patches:
        _STATE.reason = "not needed: the stock draft batch is complete"
        return plan
    if TARGET in HookRegistry._patched:
        raise DidNotEnable(f"{TARGET} was already patched before this plugin loaded")
    _STATE.original = api.proposer_cls.__dict__[FILL]
    hook = make_fill_hook(plan, result.names, api)
    HookRegistry.register(TARGET, hook, HookType.AROUND)
    _STATE.hook = hook
    _STATE.reason = "applied"
    if apply:
        HookRegistry.apply_hooks()
    return plan


def uninstrument() -> None:
    """Undo :func:`instrument`: drop our hook, restore the stock method, and
    re-apply any other plugin's hooks on the same target."""
    hook = _STATE.hook
    if hook is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry

    others = [h for h in HookRegistry._hooks.get(TARGET, []) if h[1] is not hook]
    if TARGET in HookRegistry._patched:
        api = load_sglang_api()
        setattr(api.proposer_cls, FILL, _STATE.original)
        HookRegistry._patched.discard(TARGET)
    if others:
        HookRegistry._hooks[TARGET] = others
        HookRegistry.apply_hooks()
    else:
        HookRegistry._hooks.pop(TARGET, None)
    _STATE.hook = None
    _STATE.original = None
    _STATE.reason = "uninstrumented"
