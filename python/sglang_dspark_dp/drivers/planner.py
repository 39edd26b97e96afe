"""Stand-ins around DSpark's verify planner on CPU: model runner, draft
model, runtime settings, a replaying group, relay events, a decode batch.

Probe and harness material, no model behind it. The planner, its budget
planner, its SPS table, its top-k schedule, its layout and (on the overlap
path) its confidence relay are the installed SGLang objects; these stand in
only for what needs a GPU, a model or SGLang's process groups. Methods the
installed code calls on a stand-in take what the installed method takes
(:func:`sglang_dspark_dp.drivers.worker.following`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.adapter.planner import installed_class
from sglang_dspark_dp.drivers.worker import following, installed_signature

#: The scheduler batch, forward mode and CUDA classes whose methods the
#: stand-ins answer for.
_BATCH = ("sglang.srt.managers.schedule_batch", "ScheduleBatch")
_FORWARD_MODE = ("sglang.srt.model_executor.forward_batch_info", "ForwardMode")
_FUTURE_MAP = ("sglang.srt.managers.overlap_utils", "FutureMap")


def _cuda_class(name: str) -> type | None:
    import torch

    return getattr(torch.cuda, name, None)


def model_runner(
    *, req_pool_size: int, capture_num_tokens: list[int], max_bs: int
) -> Any:
    """The attributes the planner reads from its model runner: the request
    pool (its row count and each row's generation) and a decode CUDA-graph
    runner that captured ragged-verify graphs at ``capture_num_tokens``
    tokens for up to ``max_bs`` requests."""
    import torch

    pool = SimpleNamespace(
        req_to_token=torch.zeros((req_pool_size, 1), dtype=torch.int32),
        req_generation=torch.zeros((req_pool_size,), dtype=torch.int64),
    )
    graphs = SimpleNamespace(
        ragged_verify_mode=True,
        capture_num_tokens=list(capture_num_tokens),
        max_bs=max_bs,
    )
    return SimpleNamespace(req_to_token_pool=pool, decode_cuda_graph_runner=graphs)


def draft_model() -> Any:
    """A draft model with a confidence head (the planner only checks that
    it has one: the confidences are given, not computed)."""
    return SimpleNamespace(confidence_head=SimpleNamespace(sts_temperatures=None))


def runtime(
    *, tp_size: int, disable_overlap_schedule: bool, sps_table_path: str | None
) -> Any:
    """One namespace standing in for the server args, the parallel context
    and the config bags the planner reads: plain TP, no DP attention, no
    STS calibration, no graph-tier alignment, a profiled SPS table at
    ``sps_table_path``."""
    return SimpleNamespace(
        tp_size=tp_size,
        pp_size=1,
        attn_tp_size=tp_size,
        attn_cp_size=1,
        enable_dp_attention=False,
        disable_overlap_schedule=disable_overlap_schedule,
        speculative_dspark_align_verify_tokens_to_graph_tier=False,
        speculative_dspark_confidence_sts_path=None,
        speculative_dspark_sps_table_path=sps_table_path,
        speculative_skip_dp_mlp_sync=False,
        max_running_requests=256,
        disaggregation_mode="null",
    )


class ReplayGroup:
    """A one-process stand-in for a two-rank group: several simulated ranks
    run one after the other; the first (``rank_in_group`` 0, the source)
    records what it broadcasts, each later one receives those payloads in
    order, as the collective would deliver them. ``calls`` counts this
    simulated rank's broadcasts; ``missing`` / ``extra`` say where its
    sequence does not match the source's."""

    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size
        self.rank_in_group = 0
        self.ranks = list(range(world_size))
        self.cpu_group = object()  # a token, never communicated over
        self._recorded: list[Any] = []
        self._cursor = 0
        self.calls = 0
        self.extra = 0

    def act_as(self, rank: int) -> None:
        """Start a simulated rank's turn (0: record afresh; else replay)."""
        self.rank_in_group = rank
        self.calls = 0
        self.extra = 0
        self._cursor = 0
        if rank == 0:
            self._recorded = []

    @property
    def missing(self) -> int:
        """Broadcasts the source made that this simulated rank did not."""
        return max(len(self._recorded) - self._cursor, 0)

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        self.calls += 1
        if self.rank_in_group == src:
            self._recorded.append(tensor.clone())
            return tensor
        if self._cursor >= len(self._recorded):
            self.extra += 1  # the source never sends this one: a hang
            return tensor
        sent = self._recorded[self._cursor]
        self._cursor += 1
        if sent.shape != tensor.shape:
            raise RuntimeError(
                f"broadcast mismatch: the source sent shape {tuple(sent.shape)}, "
                f"this rank expects {tuple(tensor.shape)}"
            )
        tensor.copy_(sent)
        return tensor

    def exchange(self, value: int) -> int:
        """One int64 broadcast from the source (what a repair's budget
        exchange does over a real group)."""
        import torch

        t = torch.tensor([value], dtype=torch.int64)
        self.broadcast(t, src=0)
        return int(t.item())

    def barrier(self) -> None:
        return None


class CopyEvent:
    """A stand-in for the CUDA event the relay records after each ring copy:
    ``query()`` answers whether the copy has landed, as ``landed()`` says
    (the harness makes a rank's copy late on chosen steps), and
    ``synchronize()`` waits for it: the copy has landed from then until the
    next ``record()`` (a new copy into the slot). ``waits`` counts the
    synchronizations."""

    def __init__(self, landed: Any) -> None:
        self._landed = landed
        self._waited = False
        cls = _cuda_class("Event")
        self.record = following(
            installed_signature(cls, "record"), lambda _b: self._recorded()
        )
        self.query = following(
            installed_signature(cls, "query"),
            lambda _b: self._waited or bool(self._landed()),
        )
        self.synchronize = following(
            installed_signature(cls, "synchronize"), lambda _b: self._wait()
        )
        self.records = 0
        self.waits = 0

    def _recorded(self) -> None:
        self.records += 1
        self._waited = False

    def _wait(self) -> None:
        self.waits += 1
        self._waited = True


class CopyStream:
    """The relay's side stream: waits on an event (nothing to wait for on
    CPU). ``torch.cpu.stream(...)`` accepts it as the current stream."""

    def __init__(self) -> None:
        self.wait_event = following(
            installed_signature(_cuda_class("Stream"), "wait_event"), lambda _b: None
        )


class FutureMapStandIn:
    """The future map as the planner's overlap path uses it: resolving a
    batch's lagged confidences through the installed relay."""

    def __init__(self, relay: Any, stream: Any, publish_ready: Any) -> None:
        self.confidence_relay = relay
        self.resolve_confidence_cpu = following(
            installed_signature(
                installed_class(*_FUTURE_MAP), "resolve_confidence_cpu"
            ),
            self._resolve,
        )
        self.stream = stream
        self.publish_ready = publish_ready

    def _resolve(self, bound: Any) -> Any:
        batch = next(iter(bound.arguments.values()))
        return self.confidence_relay.resolve(
            batch, stream=self.stream, publish_ready=self.publish_ready
        )

    def publish(self, rows: Any, confidence: Any) -> None:
        """What the forward's publish does with a step's confidences: into
        the relay's buffer, then the lagged ring copy."""
        self.confidence_relay.scatter(rows, confidence)
        self.confidence_relay.issue_ring_copy(
            stream=self.stream, publish_ready=self.publish_ready
        )


def decode_batch(*, req_pool_indices: Any) -> Any:
    """A decode ``ScheduleBatch`` as the planner's overlap path reads it: a
    draft input whose future indices are its request rows (the relay is
    indexed by request row), a decode forward mode, the rows on host and
    device."""
    bs = int(req_pool_indices.shape[0])
    draft_input = SimpleNamespace(
        verify_token_budget=None,
        future_indices=req_pool_indices.clone(),
    )
    forward_mode = SimpleNamespace()
    forward_mode.is_extend = following(
        installed_signature(installed_class(*_FORWARD_MODE), "is_extend"),
        lambda _b: False,
    )
    batch = SimpleNamespace(
        spec_info=draft_input,
        forward_mode=forward_mode,
        is_extend_in_batch=False,
        req_pool_indices=req_pool_indices,
        req_pool_indices_cpu=req_pool_indices.clone(),
        spec_verify_tier_num_tokens=None,
        global_spec_verify_tier_num_tokens=None,
    )
    batch.batch_size = following(
        installed_signature(installed_class(*_BATCH), "batch_size"), lambda _b: bs
    )
    return batch
