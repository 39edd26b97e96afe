"""The plugin's core without SGLang: the derivation, its buffers, the field
names, the plan chosen from a probe result, the expectations and the status
of a repair. A small fake ``ForwardBatch`` dataclass stands in for SGLang's;
nothing here imports SGLang. What a derived batch must hold comes from the
suite's oracle (``test/srt/oracle.py``, which imports no SGLang either)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_dspark_dp import expectations
from sglang_dspark_dp.outcome import DidNotEnable, Outcome, Status
from sglang_dspark_dp.registry import NotNeeded, Repair
from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
    ALL_GROUPS,
    NON_PADDED,
    SCALED,
    UNSCALED,
    DraftDPBuffers,
    DraftDPFieldNames,
    derive_draft_dp_metadata,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "srt"))
import oracle  # noqa: E402

#: The fake spec info's widths: draft tokens and logprob tokens per request.
WIDTH, LOGPROB_WIDTH = 3, 2


@dataclasses.dataclass
class FakeForwardBatch:
    input_ids: Any = None
    spec_info: Any = None
    original_global_num_tokens_cpu: Any = None
    num_token_non_padded: Any = None
    num_token_non_padded_cpu: Any = None
    global_num_tokens_cpu: Any = None
    global_num_tokens_gpu: Any = None
    global_num_tokens_for_logprob_cpu: Any = None
    global_num_tokens_for_logprob_gpu: Any = None
    can_run_dp_cuda_graph: Any = None


@dataclasses.dataclass
class RenamedForwardBatch:
    """A later layout: the non-padded counts renamed, the graph flag too."""

    input_ids: Any = None
    original_global_num_tokens_cpu: Any = None
    global_num_token_non_padded: Any = None
    global_num_token_non_padded_cpu: Any = None
    global_num_tokens_cpu: Any = None
    global_num_tokens_gpu: Any = None
    global_num_tokens_for_logprob_cpu: Any = None
    global_num_tokens_for_logprob_gpu: Any = None


def fake_scale(spec_info, counts, logprob_counts):
    """Stands in for SGLang's scaling: each row by its own width."""
    return [c * WIDTH for c in counts], [c * LOGPROB_WIDTH for c in logprob_counts]


def batch(counts, *, coordinated=False, graph_ok=True):
    return SimpleNamespace(
        global_num_tokens=counts,
        global_num_tokens_for_logprob=oracle.logprob_row(counts),
        can_run_dp_cuda_graph=graph_ok,
        dp_spec_prefill_coordination_applied=coordinated,
    )


def draft_batch(cls=FakeForwardBatch, bs=2):
    return cls(input_ids=torch.zeros(bs * WIDTH, dtype=torch.int64))


def derive(
    fb,
    b,
    *,
    dp=True,
    groups=ALL_GROUPS,
    buffers=None,
    names=None,
    device_count=True,
    honours_coordination=True,
):
    names = names or DraftDPFieldNames.for_forward_batch(type(fb))
    buffers = buffers or DraftDPBuffers("cpu")
    derive_draft_dp_metadata(
        fb,
        b,
        spec_info=None,
        dp_moe_sync=dp,
        buffers=buffers,
        groups=groups,
        names=names,
        scale=fake_scale,
        device_count=device_count,
        honours_coordination=honours_coordination,
    )
    return names, buffers


def step_of(bs, counts, **inputs):
    """What the oracle is told of a step: ``bs`` requests here, the rows
    ``batch(counts)`` hands over, the fake widths."""
    inputs.setdefault("device_count", True)
    return oracle.Step(
        requests=bs,
        width=WIDTH,
        logprob_width=LOGPROB_WIDTH,
        counts=counts,
        logprob_counts=oracle.logprob_row(counts),
        **inputs,
    )


def by_key(fb):
    return oracle.by_key(fb, DraftDPFieldNames.for_forward_batch(type(fb)))


def wrong(fb, bs, counts, **inputs):
    """The fields of ``fb`` that are not what the oracle says: {} if none."""
    return oracle.mismatches(by_key(fb), step_of(bs, counts, **inputs))


def test_dp_path_derives_every_field():
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 0, 5]))
    assert wrong(fb, 2, [2, 0, 5], graph_ok=True) == {}


def test_coordinated_counts_pass_through_unscaled():
    fb = draft_batch(bs=1)
    derive(fb, batch([4, 1], coordinated=True, graph_ok=False))
    assert wrong(fb, 1, [4, 1], coordinated=True, graph_ok=False) == {}


def test_the_coordination_flag_is_read_only_where_the_stock_fill_reads_it():
    """A release whose stock fill never reads the flag scales whatever the
    batch says (a truthy stand-in such as a ``MagicMock`` attribute must not
    change the values)."""
    fb = draft_batch(bs=1)
    derive(fb, batch([4, 1], coordinated=True), honours_coordination=False)
    assert wrong(fb, 1, [4, 1]) == {}
    plain = SimpleNamespace(
        global_num_tokens=[4, 1],
        global_num_tokens_for_logprob=oracle.logprob_row([4, 1]),
        can_run_dp_cuda_graph=True,
    )
    fb = draft_batch(bs=1)
    derive(fb, plain, honours_coordination=False)  # no flag at all: no error
    assert wrong(fb, 1, [4, 1]) == {}


def test_attention_tp_path_writes_only_the_non_padded_counts():
    fb = draft_batch(bs=2)
    derive(fb, batch(None), dp=False)
    assert wrong(fb, 2, None) == {}
    assert fb.can_run_dp_cuda_graph is None
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 2]), dp=False)  # counts present, DP sync off
    assert wrong(fb, 2, None) == {}


#: The keys each field group holds (a group not written leaves them unset).
GROUP_KEYS = {
    UNSCALED: ("unscaled",),
    NON_PADDED: ("non_padded", "non_padded_cpu"),
    SCALED: (
        "scaled_cpu",
        "scaled_gpu",
        "scaled_logprob_cpu",
        "scaled_logprob_gpu",
        "dp_graph_ok",
    ),
}


@pytest.mark.parametrize(
    "groups", [frozenset({g}) for g in GROUP_KEYS] + [frozenset(GROUP_KEYS)]
)
def test_only_the_requested_groups_are_written(groups):
    fb = draft_batch(bs=1)
    derive(fb, batch([1, 3]), groups=groups)
    written = {k for g in groups for k in GROUP_KEYS[g]}
    assert {k for k in wrong(fb, 1, [1, 3], graph_ok=True)} == (
        {k for keys in GROUP_KEYS.values() for k in keys} - written
    )
    assert all(v is None for k, v in by_key(fb).items() if k not in written)


def test_idle_rank_counts_zero_tokens():
    fb = draft_batch(bs=0)
    derive(fb, batch([0, 4]))
    assert wrong(fb, 0, [0, 4]) == {}


def test_buffers_are_reused_and_reallocated_only_for_a_new_dp_size():
    buffers = DraftDPBuffers("cpu", with_non_padded=True)
    first = draft_batch(bs=1)
    derive(first, batch([1, 2]), buffers=buffers)
    views = (
        first.num_token_non_padded,
        first.global_num_tokens_gpu,
        first.global_num_tokens_for_logprob_gpu,
    )

    def same_views(fb):
        return all(
            a is b and a.data_ptr() == b.data_ptr()
            for a, b in zip(
                views,
                (
                    fb.num_token_non_padded,
                    fb.global_num_tokens_gpu,
                    fb.global_num_tokens_for_logprob_gpu,
                ),
                strict=True,
            )
        )

    second = draft_batch(bs=2)
    derive(second, batch([2, 7]), buffers=buffers)
    assert same_views(second)
    assert wrong(second, 2, [2, 7]) == {}
    third = draft_batch(bs=1)
    derive(third, batch([1, 1, 1, 1]), buffers=buffers)  # DP 2 -> 4
    # A new DP size lays the packed buffer out anew, scalar included.
    assert wrong(third, 1, [1, 1, 1, 1]) == {}
    views = (
        third.num_token_non_padded,
        third.global_num_tokens_gpu,
        third.global_num_tokens_for_logprob_gpu,
    )
    fourth = draft_batch(bs=2)
    derive(fourth, batch([2, 1, 1, 1]), buffers=buffers)
    assert same_views(fourth)
    assert wrong(fourth, 2, [2, 1, 1, 1]) == {}


def test_without_the_device_count_only_the_host_count_is_written():
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 1]), device_count=False)
    assert wrong(fb, 2, [2, 1], device_count=False) == {}


def test_renamed_fields_are_found_and_written():
    names = DraftDPFieldNames.for_forward_batch(RenamedForwardBatch)
    assert names.non_padded == "global_num_token_non_padded"
    assert names.non_padded_cpu == "global_num_token_non_padded_cpu"
    assert names.dp_graph_ok is None
    assert names.missing("dp_graph_ok", "unscaled") == ["dp_graph_ok"]
    fb = draft_batch(RenamedForwardBatch, bs=1)
    groups = frozenset({UNSCALED, NON_PADDED})  # no graph flag to write
    derive(fb, batch([1, 0]), names=names, groups=groups)
    written = {k for g in groups for k in GROUP_KEYS[g]}
    assert not written & set(wrong(fb, 1, [1, 0]))


# -- expectations ---------------------------------------------------------


def observed(fb):
    names = DraftDPFieldNames.for_forward_batch(type(fb))
    return expectations.observe(fb, names, read_device=True), names


def want(bs, counts, rank=0):
    return expectations.expect(
        tokens=bs * WIDTH, counts=counts, width=WIDTH, device_count=True, rank=rank
    )


def test_a_derived_batch_meets_the_expectations():
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 0, 5]))
    seen, _ = observed(fb)
    assert expectations.check(seen, want(2, [2, 0, 5])) == []
    assert seen["non_padded"].value == 6 and seen["non_padded"].shape == ()


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("original_global_num_tokens_cpu", None, "expected a per-rank list"),
        ("original_global_num_tokens_cpu", [2, 0], "one entry per DP rank"),
        ("original_global_num_tokens_cpu", [2, 0, -5], "non-negative ints"),
        ("original_global_num_tokens_cpu", [2, 1, 5], "raw per-rank counts"),
        ("global_num_tokens_cpu", [2, 0, 5], "unscaled x draft block width"),
        ("num_token_non_padded_cpu", 7, "exceeds"),
        ("num_token_non_padded_cpu", 5, "expected 6 draft tokens"),
        ("num_token_non_padded", torch.tensor(6), "int32"),
        ("num_token_non_padded", None, "device int32 scalar"),
        ("num_token_non_padded", torch.tensor(5, dtype=torch.int32), "expected 6"),
    ],
)
def test_each_wrong_field_is_one_named_gap(field, value, why):
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 0, 5]))
    setattr(fb, field, value)
    seen, names = observed(fb)
    gaps = expectations.check(seen, want(2, [2, 0, 5]))
    assert len(gaps) >= 1
    assert getattr(names, gaps[0].key) == field
    assert why in gaps[0].why
    assert field in gaps[0].render(names)


def test_device_values_are_not_read_when_not_asked():
    fb = draft_batch(bs=2)
    derive(fb, batch([2, 0]))
    fb.num_token_non_padded.fill_(99)  # wrong, but only visible if read
    names = DraftDPFieldNames.for_forward_batch(FakeForwardBatch)
    seen = expectations.observe(fb, names, read_device=False)
    assert seen["non_padded"].value is None
    assert expectations.check(seen, want(2, [2, 0])) == []


# -- the plan chosen from a probe result ----------------------------------


def probe_result(gaps_dp=(), gaps_local=(), replaceable=True):
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        ProbeResult,
    )

    names = DraftDPFieldNames()
    field = {g: getattr(names, g) for g in ("unscaled", "non_padded")}
    return ProbeResult(
        names=names,
        missing_dp=tuple(field[g] for g in gaps_dp),
        missing_local=tuple(field[g] for g in gaps_local),
        replaceable=replaceable,
        foreign_fields=() if replaceable else ("something_else",),
        gaps_dp=tuple(expectations.Gap(g, 1, None, "x") for g in gaps_dp),
        gaps_local=tuple(expectations.Gap(g, 1, None, "x") for g in gaps_local),
    )


def plan_for(result, guard=False):
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        RepairPlan,
    )

    return RepairPlan.from_probe(result, guard=guard)


def test_a_broken_replaceable_dp_fill_is_replaced_whole():
    plan = plan_for(probe_result(gaps_dp=("unscaled",), gaps_local=("non_padded",)))
    assert plan.dp_groups == ALL_GROUPS and not plan.dp_calls_stock
    assert plan.local_groups == frozenset({NON_PADDED})
    assert plan.patches and "replaced" in plan.describe()


def test_a_fill_with_foreign_fields_is_kept_and_completed():
    plan = plan_for(probe_result(gaps_dp=("unscaled",), replaceable=False))
    assert plan.dp_groups == frozenset({UNSCALED}) and plan.dp_calls_stock
    assert SCALED not in plan.dp_groups


def test_a_complete_fill_is_left_alone_unless_the_guard_is_on():
    assert not plan_for(probe_result()).patches
    assert "untouched" in plan_for(probe_result()).describe()
    assert plan_for(probe_result(), guard=True).patches


# -- status and the repair base -------------------------------------------


class Scripted(Repair):
    name = "scripted"

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def setup_once(self):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_a_repair_that_cannot_apply_is_not_applicable_not_a_crash():
    st = Scripted(DidNotEnable("no DSpark here")).instrument()
    assert st.outcome is Outcome.NOT_APPLICABLE and not st.healthy
    assert st.line().startswith("sglang-dspark-dp: scripted: not applicable")
    assert st.line().endswith(": no DSpark here")
    st = Scripted(RuntimeError("boom")).instrument()
    assert st.outcome is Outcome.NOT_APPLICABLE
    assert "could not be set up: RuntimeError: boom" in st.reason


def test_a_repair_not_needed_patches_nothing_and_uninstrument_is_a_noop():
    r = Scripted(NotNeeded("already right", {"k": 1}))
    st = r.instrument()
    assert st.outcome is Outcome.NOT_NEEDED and st.healthy and not st.enabled
    assert st.as_dict()["detail"] == {"k": 1} and not r.instrumented
    r.uninstrument()
    r.uninstrument()
    assert r.status() is st


def test_status_line_and_dict():
    st = Status("x", Outcome.ENABLED, "why", "0.5.16", {"a": [1]})
    assert st.line() == "sglang-dspark-dp: x: enabled on sglang 0.5.16: why"
    assert st.as_dict() == {
        "repair": "x",
        "outcome": "enabled",
        "reason": "why",
        "sglang": "0.5.16",
        "detail": {"a": [1]},
        "changes": [],
    }


def test_status_line_names_the_upstream_changes_missing_first():
    from sglang_dspark_dp.upstream import State, Verdict

    verdicts = (
        Verdict("dp-draft-metadata", State.IN, "carried"),
        Verdict("tp-draft-non-padded", State.NOT_IN, "misses a field"),
        Verdict("dp-fill-no-host-wait", State.NOT_IN, "waits"),
        Verdict("non-overlap-pp-proxy", State.NOT_AFFECTED, "no such call"),
    )
    st = Status("x", Outcome.ENABLED, "why", "0.5.17", {}, verdicts)
    assert st.line() == (
        "sglang-dspark-dp: x: enabled on sglang 0.5.17 (tp-draft-non-padded, "
        "dp-fill-no-host-wait not in this build; #33098 in this build; #39262 not "
        "affected): why"
    )
    assert st.as_dict()["changes"][0] == {
        "change": "dp-draft-metadata",
        "label": "#33098",
        "state": "in this build",
        "evidence": "carried",
    }


def test_the_core_imports_no_sglang():
    code = (
        "import sys\n"
        "import sglang_dspark_dp, sglang_dspark_dp.registry, sglang_dspark_dp.cli\n"
        "import sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft\n"
        "import sglang_dspark_dp.drivers.draft, sglang_dspark_dp.harness.lockstep\n"
        "face = sglang_dspark_dp\n"
        "assert all(callable(f) for f in (face.instrument, face.uninstrument))\n"
        "assert [s.repair for s in face.status()] == face.registry.names()\n"
        "assert issubclass(face.DidNotEnable, Exception)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'sglang')\n"
        "print(bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# --------------------------------------------------------------------------
# Steady state: a repeat issues no device work, and never serves a stale value.
# --------------------------------------------------------------------------


class DeviceWork(TorchDispatchMode):
    """Counts the tensor operations that write a buffer (fill_, copy_)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.endswith("_") and not name.startswith("_"):
            self.writes.append(name)
        return func(*args, **(kwargs or {}))


def step(buffers, counts, bs):
    fb = draft_batch(bs=bs)
    derive(fb, batch(counts), buffers=buffers)
    return fb


def test_a_repeated_step_issues_no_device_work_and_keeps_the_values():
    buffers = DraftDPBuffers("cpu")
    step(buffers, [2, 3], bs=2)
    with DeviceWork() as work:
        fb = step(buffers, [2, 3], bs=2)
    assert work.writes == []
    assert wrong(fb, 2, [2, 3]) == {}


@pytest.mark.parametrize(
    "then, bs",
    [
        ([2, 4], 2),  # one other rank's count
        ([1, 3], 1),  # this rank's count
        ([2, 3, 0, 0], 2),  # DP size
        ([0, 3], 0),  # an idle step
    ],
)
def test_a_changed_input_is_written(then, bs):
    buffers = DraftDPBuffers("cpu")
    step(buffers, [2, 3], bs=2)
    assert wrong(step(buffers, then, bs=bs), bs, then) == {}


def test_busy_idle_busy_serves_each_steps_values():
    buffers = DraftDPBuffers("cpu")
    for counts, bs in (([2, 3], 2), ([0, 3], 0), ([2, 3], 2)):
        assert wrong(step(buffers, counts, bs), bs, counts) == {}


def test_an_in_place_write_by_someone_else_is_overwritten_on_a_repeat():
    """SGLang writes these tensors in place on some paths (the eager DP
    step's ``prepare_mlp_sync_batch`` copies padded counts into
    ``global_num_tokens_gpu``): a repeat after that must write again."""
    buffers = DraftDPBuffers("cpu")
    fb = step(buffers, [2, 3], bs=2)
    fb.global_num_tokens_gpu.copy_(torch.tensor([9, 9]))  # padded by SGLang
    fb.global_num_tokens_for_logprob_gpu.copy_(torch.tensor([9, 9]))
    fb.num_token_non_padded.fill_(99)
    assert wrong(step(buffers, [2, 3], bs=2), 2, [2, 3]) == {}


def test_the_caller_mutating_its_count_list_does_not_fool_the_repeat_check():
    buffers = DraftDPBuffers("cpu")
    counts = [2, 3]
    step(buffers, counts, bs=2)
    counts[1] = 5  # the same list object, new values
    assert wrong(step(buffers, counts, bs=2), 2, [2, 5]) == {}


# --------------------------------------------------------------------------
# The packed buffer: one copy per changed step, two host buffers alternating.
# --------------------------------------------------------------------------


def test_scalar_and_rows_are_views_of_one_packed_tensor():
    buffers = DraftDPBuffers("cpu")
    fb = step(buffers, [2, 3], bs=2)
    scalar, row, logprob_row = (
        fb.num_token_non_padded,
        fb.global_num_tokens_gpu,
        fb.global_num_tokens_for_logprob_gpu,
    )
    assert (scalar.dtype, scalar.dim()) == (torch.int32, 0)
    assert row.dtype == logprob_row.dtype == torch.int64
    base = scalar.untyped_storage().data_ptr()
    assert row.untyped_storage().data_ptr() == base
    assert logprob_row.untyped_storage().data_ptr() == base
    # The scalar's bytes come first, then the two rows, back to back.
    assert row.data_ptr() == base + 8
    assert logprob_row.data_ptr() == base + 8 + 8 * 2


def test_a_changed_step_is_one_copy_and_no_kernel():
    buffers = DraftDPBuffers("cpu")
    step(buffers, [2, 3], bs=2)
    with DeviceWork() as work:
        fb = step(buffers, [1, 4], bs=1)  # the scalar and both rows change
    assert work.writes == ["copy_"]
    assert wrong(fb, 1, [1, 4]) == {}
    with DeviceWork() as work:
        fb = step(buffers, [1, 5], bs=1)  # the rows alone change
    assert work.writes == ["copy_"]
    assert wrong(fb, 1, [1, 5]) == {}


def test_a_part_not_given_keeps_its_value():
    buffers = DraftDPBuffers("cpu")
    scalar, rows = buffers.update(7, [1, 2], [3, 4])
    buffers.update(counts=[5, 6], logprob_counts=[7, 8])
    assert int(scalar) == 7 and rows[1].tolist() == [7, 8]
    buffers.update(non_padded=9)
    assert int(scalar) == 9 and rows[0].tolist() == [5, 6]


def test_mismatched_rank_counts_are_refused_by_name():
    with pytest.raises(ValueError, match="logprob_counts has 1 ranks, counts 2"):
        DraftDPBuffers("cpu").update(1, [1, 2], [1])


class StandInEvent:
    """An event whose copy completes only when the test says so."""

    def __init__(self, log, check):
        self.done, self.log, self.check = False, log, check

    def record(self, *stream):
        self.done = False
        self.log.append("record")

    def query(self):
        return self.done

    def synchronize(self):
        self.check()  # runs while the host buffer must still be intact
        self.log.append("synchronize")
        self.done = True


def host_words(buffers, i):
    return buffers._hosts[i][0].tolist()


def test_a_host_buffer_is_never_rewritten_while_its_copy_is_in_flight():
    log, events = [], []
    state = {}

    def check():
        assert host_words(buffers, 0) == state["first"], "rewritten in flight"

    def factory():
        events.append(StandInEvent(log, check))
        return events[-1]

    buffers = DraftDPBuffers("cpu", event_factory=factory)
    step(buffers, [2, 3], bs=2)  # host buffer 0, its copy in flight
    state["first"] = host_words(buffers, 0)
    assert len(events) == 1 and not events[0].done
    fb = step(buffers, [1, 3], bs=1)  # the other buffer: no wait
    assert host_words(buffers, 0) == state["first"]
    assert wrong(fb, 1, [1, 3]) == {}
    assert buffers.host_waits == 0 and "synchronize" not in log
    fb = step(buffers, [2, 4], bs=2)  # buffer 0 again, still in flight: wait
    assert log.count("synchronize") == 1 and buffers.host_waits == 1
    assert log.index("synchronize") < len(log) - 1  # waited, then recorded
    assert wrong(fb, 2, [2, 4]) == {}
    assert host_words(buffers, 0) != state["first"]


def test_a_completed_copy_frees_its_host_buffer_without_a_wait():
    log, events = [], []

    def factory():
        events.append(StandInEvent(log, lambda: None))
        return events[-1]

    buffers = DraftDPBuffers("cpu", event_factory=factory)
    for counts in ([2, 3], [1, 3], [2, 4], [1, 4], [3, 3]):
        for event in events:
            event.done = True  # the GPU keeps up
        fb = step(buffers, counts, bs=counts[0])
        assert wrong(fb, counts[0], counts) == {}
    assert buffers.host_waits == 0 and "synchronize" not in log
    assert len(events) == DraftDPBuffers.DEPTH == 2  # one event per buffer


def test_a_repeat_records_no_event():
    log = []
    buffers = DraftDPBuffers("cpu", event_factory=lambda: StandInEvent(log, None))
    step(buffers, [2, 3], bs=2)
    step(buffers, [2, 3], bs=2)
    assert log == ["record"]


# --- The fill's host buffers are page-locked where the device is CUDA ------


def test_a_cuda_device_gets_page_locked_host_buffers_and_the_cpu_does_not():
    from sglang_dspark_dp import adapter

    assert adapter.pins_host_memory(torch.device("cuda"))
    assert adapter.pins_host_memory(torch.device("cuda", 1))
    assert not adapter.pins_host_memory(torch.device("cpu"))
    assert not adapter.pins_host_memory(torch.device("meta"))
    buffers = DraftDPBuffers("cpu", with_non_padded=True)
    assert buffers.pinned is False  # CPU: nothing to pin, nothing asked


def test_a_host_buffer_asked_page_locked_reaches_torchs_pinning():
    """Where CUDA is absent, torch refuses to pin (it needs the driver):
    that refusal is the proof the request reached it. On a GPU machine the
    buffer must come back page-locked."""
    from sglang_dspark_dp import adapter

    plain = adapter.host_buffer(5, torch.int64, pinned=False)
    assert plain.shape == (5,) and plain.dtype == torch.int64
    assert not adapter.is_pinned(plain)
    if torch.cuda.is_available():
        assert adapter.is_pinned(adapter.host_buffer(5, torch.int64, pinned=True))
    else:
        with pytest.raises(RuntimeError):
            adapter.host_buffer(5, torch.int64, pinned=True)


def test_the_fill_asks_for_page_locked_buffers_and_says_when_they_are_not(
    monkeypatch, caplog
):
    """The buffers of a CUDA device ask the adapter for page-locked host
    memory, every one of them, and check what came back through it: a
    pageable buffer (here: what a machine without CUDA can give) is said,
    not silently copied from. ``meta`` stands in for the CUDA device side
    (no memory behind it); the adapter's answer for it is CUDA's."""
    from sglang_dspark_dp import adapter

    asked = []

    def host_buffer(numel, dtype, *, pinned):
        asked.append(pinned)
        return torch.zeros(numel, dtype=dtype)

    monkeypatch.setattr(adapter.base, "host_buffer", host_buffer)
    monkeypatch.setattr(
        adapter.base,
        "pins_host_memory",
        lambda device: device.type == "meta" or device.type == "cuda",
    )
    with caplog.at_level("WARNING", logger="sglang_dspark_dp"):
        buffers = DraftDPBuffers("meta", with_non_padded=True)
    assert asked == [True] * DraftDPBuffers.DEPTH
    assert buffers.pinned is False
    said = [r.getMessage() for r in caplog.records if "pageable" in r.getMessage()]
    assert len(said) == 1 and "meta" in said[0], said


class CopyCalls(TorchDispatchMode):
    """Records every tensor operation, and each copy's ``non_blocking``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.non_blocking: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        if func.overloadpacket.__name__ == "copy_":
            self.non_blocking.append(bool(args[2] if len(args) > 2 else False))
        return func(*args, **(kwargs or {}))


def test_a_changed_step_on_cuda_never_makes_the_host_wait(monkeypatch):
    """On a CUDA device a changed step is ONE non-blocking copy (from the
    page-locked buffer) and no other tensor operation (no allocation, no
    kernel), with an event recorded on the device's current stream; a
    repeat is nothing. ``meta`` stands in for the device side
    (the copy is recorded, no memory moves); the adapter says what CUDA's
    answers would be: pinning asked for, the current stream."""
    from sglang_dspark_dp import adapter

    streams = []
    monkeypatch.setattr(adapter.base, "pins_host_memory", lambda device: True)
    monkeypatch.setattr(
        adapter.base,
        "host_buffer",
        lambda numel, dtype, *, pinned: torch.zeros(numel, dtype=dtype),
    )
    monkeypatch.setattr(
        adapter.base, "current_stream", lambda device: streams.append(device) or "s"
    )
    log = []

    class Event(StandInEvent):
        def record(self, *stream):
            assert stream == ("s",), stream
            super().record(*stream)

    buffers = DraftDPBuffers("meta", event_factory=lambda: Event(log, lambda: None))
    buffers.update(8, [2, 3], [2, 3])  # the first step lays the buffers out
    with CopyCalls() as calls:
        buffers.update(8, [2, 3], [2, 3])  # a repeat: nothing
        buffers.update(4, [1, 3], [1, 3])
    assert calls.ops == ["copy_"]
    assert calls.non_blocking == [True]
    assert log == ["record", "record"] and len(streams) == 2
    assert streams[0] == torch.device("meta") and buffers.host_waits == 0
