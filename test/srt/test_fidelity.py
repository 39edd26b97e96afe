"""The plugin's fill is indistinguishable from the stock fill for every
caller: the same inputs read from the same places, the same values, no
exception the stock fill would not raise.

Two kinds of caller, on whatever release is installed:

* SGLang's unit-test style: a proposer made with ``__new__`` holding only
  what the stock fill reads, a bare draft batch holding only ``input_ids``,
  a bare schedule batch, and ``enable_num_token_non_padded`` patched in the
  draft module's namespace (the scenario of upstream's regression test for
  the DP fill, written here from its description);
* real batches from the drivers, busy and idle, EP on and off, across DP
  sizes, with the scheduler's graph veto and (where the stock fill reads
  it) the DP prefill coordination flag.

Where the stock DP path is correct, the plugin's replacement fill (forced
on, wherever the probe says it could replace the stock one) must give
field-for-field the stock values; where it is broken, the plugin must add
what the fixing release's meaning says of every field the stock fill
leaves unset (the suite's oracle, ``oracle.py``: never the plugin's own
output), and agree with stock on everything stock sets.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from types import SimpleNamespace
from unittest import mock

import oracle
import pytest
import torch

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import parallel_override
from sglang_dspark_dp.drivers import builders
from sglang_dspark_dp.srt.model_executor.forward_batch_info import ALL_GROUPS
from sglang_dspark_dp.srt.speculative.dspark_components import dspark_draft

#: The scenario: 6 draft tokens per request (1 for logprob), four DP ranks,
#: this one rank 0.
WIDTH, LOGPROB_WIDTH = 6, 1
COUNTS = [1, 3, 0, 2]
LOGPROB_COUNTS = oracle.logprob_row(COUNTS)


def _value(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", v.tolist(), str(v.dtype), v.device.type)
    if v is None or isinstance(v, (bool, int, float, str, list, tuple)):
        return v
    return type(v).__name__  # objects no fill sets (spec info, modes)


def fields_of(obj) -> dict:
    """Every attribute a fill may set, values read back (CPU)."""
    if dataclasses.is_dataclass(obj):
        keys = [f.name for f in dataclasses.fields(obj)]
    else:
        keys = list(vars(obj))
    return {k: _value(getattr(obj, k, None)) for k in keys}


def forced_replacement(plugin, api):
    """The plugin's DP fill, replacing the stock one whole, whatever the
    release (the probe's own verdict on coordination), or a skip where the
    probe says the stock fill sets fields the plugin does not derive."""
    found = plugin.probe_result
    if not found.replaceable:
        pytest.skip(
            "the stock DP fill sets fields the plugin does not derive "
            f"({', '.join(found.foreign_fields)}): the plugin never replaces it"
        )
    plan = dspark_draft.RepairPlan(
        dp_groups=ALL_GROUPS,
        dp_calls_stock=False,
        local_groups=frozenset(),
        guard=False,
        honours_coordination=found.honours_coordination,
    )
    return dspark_draft.make_fill_hook(plan, found.names, api)


# --------------------------------------------------------------------------
# SGLang's unit-test style.
# --------------------------------------------------------------------------


def bare_proposer(api, needs=()):
    proposer = api.proposer_cls.__new__(api.proposer_cls)
    proposer._dp_moe_sync = True
    proposer._draft_block_spec_info = SimpleNamespace(
        num_tokens_per_req=WIDTH, num_tokens_for_logprob_per_req=LOGPROB_WIDTH
    )
    proposer.draft_model_runner = SimpleNamespace(device="cpu")
    for name in needs:
        setattr(proposer, name, None)
    return proposer


def bare_batches():
    draft = SimpleNamespace(input_ids=torch.zeros(COUNTS[0] * WIDTH, dtype=torch.int64))
    batch = SimpleNamespace(
        global_num_tokens=list(COUNTS),
        global_num_tokens_for_logprob=list(LOGPROB_COUNTS),
        can_run_dp_cuda_graph=True,
    )
    return draft, batch


def bare_step(proposer):
    """What the bare scenario's draft batch must hold (the switch patched
    on, the scheduler's graph verdict yes)."""
    return oracle.Step.of(
        adapter.draft_spec_info(proposer),
        requests=COUNTS[0],
        counts=COUNTS,
        logprob_counts=LOGPROB_COUNTS,
        device_count=True,
        graph_ok=True,
    )


_NO_ATTR = re.compile(r"object has no attribute '(\w+)'")


def what_the_stock_fill_reads(api):
    """Run the stock fill on the bare scenario; where it reads a proposer
    attribute the scenario lacks (a later release's ``__init__`` state),
    add it as None, as that release's own test would. Returns the names
    added, the stock draft batch and the schedule batch's extra fields."""
    fill = adapter.stock_fill(api)
    needs: list[str] = []
    extra: dict[str, object] = {}
    for _ in range(8):
        proposer = bare_proposer(api, needs)
        draft, batch = bare_batches()
        for k, v in extra.items():
            setattr(batch, k, v)
        try:
            with mock.patch.object(
                api.draft_module,
                "enable_num_token_non_padded",
                return_value=True,
                create=True,  # stock 0.5.16 does not import it (nor read it)
            ):
                fill(proposer, draft, batch)
        except AttributeError as exc:
            name = _NO_ATTR.search(str(exc))
            if name is None:
                raise
            if "SimpleNamespace" in str(exc) and name.group(1).startswith("can_run"):
                extra[name.group(1)] = True
            elif "SimpleNamespace" in str(exc):
                extra[name.group(1)] = False
            else:
                needs.append(name.group(1))
            continue
        return needs, draft, extra
    raise AssertionError(f"the stock fill kept needing more: {needs}, {extra}")


def test_sglang_style_scenario_with_the_plugin(api, plugin, stock, sglang_version):
    """The bare scenario through the installed fill, hooked or not: what
    the oracle says of every field, and no exception. On a release whose draft
    module lacks ``enable_num_token_non_padded`` (0.5.16), the plugin
    offers it there while instrumented, so the patch can even start."""
    with stock():
        needs, _, extra = what_the_stock_fill_reads(api)
    assert hasattr(api.draft_module, "enable_num_token_non_padded"), (
        f"sglang {sglang_version}: the draft module does not answer to "
        "enable_num_token_non_padded while the plugin is loaded"
    )
    proposer = bare_proposer(api, needs)
    draft, batch = bare_batches()
    for k, v in extra.items():
        setattr(batch, k, v)
    names = plugin.probe_result.names
    with mock.patch.object(
        api.draft_module, "enable_num_token_non_padded", return_value=True
    ) as switch:
        proposer._fill_dp_moe_sync_metadata(draft, batch)
    assert switch.called, "the patched switch was not consulted"
    assert oracle.mismatches(oracle.by_key(draft, names), bare_step(proposer)) == {}


def test_the_offered_name_goes_away_with_the_plugin(api, plugin, stock):
    """Offered only while instrumented, only where stock lacks it, and
    taken away again by ``uninstrument``. What stock lacks is read from the
    draft module's source (the names it binds), not from the module, which
    an offer left behind would make look stock."""
    import ast
    import inspect

    from sglang_dspark_dp.adapter.draft import NON_PADDED_SWITCH, SCALE

    tree = ast.parse(inspect.getsource(api.draft_module))
    bound = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    bound |= {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    bound |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    lacking = sorted(n for n in (NON_PADDED_SWITCH, SCALE) if n not in bound)
    for _ in range(2):  # a second round finds what the first left behind
        with stock():
            for name in lacking:
                assert not hasattr(api.draft_module, name), name
        offered = sorted(name for _, name, _ in plugin._offered)
        assert offered == (lacking if plugin.instrumented else [])
        for name in offered:
            assert hasattr(api.draft_module, name)


def test_sglang_style_scenario_is_stock_identical(api, plugin, stock):
    """Where the stock fill completes the bare scenario, the plugin's
    replacement gives the same fields, set on the same bare objects."""
    replace = forced_replacement(plugin, api)
    with stock():
        needs, stock_draft, extra = what_the_stock_fill_reads(api)
        proposer = bare_proposer(api, needs)
        draft, batch = bare_batches()
        for k, v in extra.items():
            setattr(batch, k, v)
        with mock.patch.object(
            api.draft_module,
            "enable_num_token_non_padded",
            return_value=True,
            create=True,
        ):
            replace(adapter.stock_fill(api), proposer, draft, batch)
    names = plugin.probe_result.names
    assert fields_of(draft) == reference(
        names, fields_of(stock_draft), bare_step(proposer)
    )


def reference(names, stock_fields, step):
    """What the plugin's fill must give: stock's value of every field the
    stock fill sets, and the oracle's of every DP/EP field it leaves unset
    (on 0.5.16, the fields #33098 adds)."""
    want = dict(stock_fields)
    for key, value in oracle.expected(step).items():
        field = getattr(names, key)
        if field is not None and stock_fields.get(field) is None:
            want[field] = _value(value)
    return want


# --------------------------------------------------------------------------
# Real batches.
# --------------------------------------------------------------------------

GRID = list(
    itertools.product(
        (2, 4),  # DP size
        (1, 2),  # EP size (1: no device count)
        ("busy", "idle"),
        (True, False),  # the scheduler's graph verdict
        (False, True),  # DP prefill coordination applied
    )
)


@pytest.mark.parametrize("dp, ep, path, graph_ok, coordinated", GRID)
def test_real_batches_are_stock_identical(
    api, plugin, stock, dp, ep, path, graph_ok, coordinated
):
    replace = forced_replacement(plugin, api)
    counts = [3, 0, 1, 2][:dp] if path == "busy" else [0, 3, 1, 2][:dp]
    logprob_counts = oracle.logprob_row(counts)
    bs = counts[0]
    step = {}

    def run(fill):
        with parallel_override(api.get_parallel, dp_size=dp, dp_rank=0, ep_size=ep):
            step["device_count"] = api.enable_num_token_non_padded()
            proposer = builders.build_draft_proposer(
                api,
                draft_model_runner=builders.DeviceOnlyRunner("cpu"),
                gamma=4,
                dp_moe_sync=True,
            )
            fb = builders.make_draft_forward_batch(
                api,
                bs=bs,
                width=4,
                spec_info=adapter.draft_spec_info(proposer),
                device="cpu",
            )
            batch = builders.make_schedule_batch(
                api,
                seq_lens=torch.full((max(bs, 1),), 8, dtype=torch.int64),
                global_num_tokens=list(counts),
                global_num_tokens_for_logprob=logprob_counts,
                can_run_dp_cuda_graph=graph_ok,
            )
            batch.dp_spec_prefill_coordination_applied = coordinated
            fill(proposer, fb, batch)
            step["spec_info"] = adapter.draft_spec_info(proposer)
            return fields_of(fb)

    with stock():
        stock_fill = adapter.stock_fill(api)
        expected = run(stock_fill)
        ours = run(lambda p, f, b: replace(stock_fill, p, f, b))
    names = plugin.probe_result.names
    # Whether this release's DSpark takes coordinated rows as scaled
    # already is stock behaviour: its fill passes them through.
    passed_through = expected[names.scaled_cpu] == counts
    want = oracle.Step.of(
        step["spec_info"],
        requests=bs,
        counts=counts,
        logprob_counts=logprob_counts,
        device_count=step["device_count"],
        graph_ok=graph_ok,
        coordinated=coordinated and passed_through,
    )
    assert ours == reference(names, expected, want)


# --------------------------------------------------------------------------
# The steady-state path never serves another proposer's or device's values.
# --------------------------------------------------------------------------


def test_each_proposer_and_device_has_its_own_buffers(api, plugin):
    """Two proposers alternating, each with its own repeating counts, get
    their own values at every step; a proposer whose draft runner moves to
    another device gets new buffers there."""
    replace = forced_replacement(plugin, api)
    fill = adapter.stock_fill(api)
    names = plugin.probe_result.names
    a, b = bare_proposer(api), bare_proposer(api)
    a_counts, b_counts = [1, 3, 0, 2], [2, 2, 2, 2]

    def step(proposer, counts):
        draft = SimpleNamespace(input_ids=torch.zeros(counts[0] * WIDTH))
        batch = SimpleNamespace(
            global_num_tokens=list(counts),
            global_num_tokens_for_logprob=oracle.logprob_row(counts),
            can_run_dp_cuda_graph=True,
            can_run_decode_cuda_graph=True,
        )
        with mock.patch.object(
            api.draft_module,
            "enable_num_token_non_padded",
            return_value=True,
            create=True,
        ):
            replace(fill, proposer, draft, batch)
        return oracle.mismatches(
            oracle.by_key(draft, names),
            oracle.Step.of(
                adapter.draft_spec_info(proposer),
                requests=counts[0],
                counts=counts,
                logprob_counts=oracle.logprob_row(counts),
                device_count=True,
                graph_ok=True,
            ),
        )

    for _ in range(3):
        assert step(a, a_counts) == {}
        assert step(b, b_counts) == {}
    first = dspark_draft.proposer_buffers(a)
    assert dspark_draft.proposer_buffers(a) is first
    assert dspark_draft.proposer_buffers(b) is not first
    a.draft_model_runner.device = "meta"
    moved = dspark_draft.proposer_buffers(a)
    assert moved is not first and moved.device.type == "meta"
