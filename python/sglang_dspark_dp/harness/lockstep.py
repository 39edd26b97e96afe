"""DP lockstep harness: one process per rank, real SGLang code, CPU only.

The ranks join a ``torch.distributed`` gloo group over loopback: ``dp`` DP
ranks of ``attn_tp`` attention-TP ranks each (``--tp dp*attn_tp --dp dp
--enable-dp-attention``; with attention TP 2 the attention-TP groups are
``[0, 1]``, ``[2, 3]``, ...). The ranks of one DP rank share its requests.
At every decode step each rank:

1. takes its DP rank's running-request count from that DP rank's
   :class:`RankChurn`;
2. all-gathers ``[num_tokens, num_tokens_for_logprob, can_cuda_graph]`` over
   every rank, as SGLang's scheduler does for DP attention, keeps each DP
   rank's first attention-TP rank's row (SGLang's ``tp0_info``), and writes
   the result into its ``ScheduleBatch`` with SGLang's own
   ``_update_gather_batch`` where the installed release has it;
3. builds its DSpark draft batch with the real ``DraftBlockProposer``
   (busy path or idle path) and runs the real ``can_run_graph``;
4. all-gathers its decisions (admission, the capture size it pads to, the
   padded token count, its non-padded counts) and compares them.

A disagreement or a crash stops every rank at the same step (they all see the
same gathered decisions) with a report naming the step, the rank and the
values. Every collective has a timeout; the parent kills what is left.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections import Counter
from typing import Any

from sglang_dspark_dp.adapter import SYNC_WRITER
from sglang_dspark_dp.harness.ranks import START_METHOD_ENV, stop

MAX_DP = 16
#: Fields of a rank's decision vector (``gaps``: how many fields of its
#: draft batch are wrong, by :func:`sglang_dspark_dp.expectations.check`).
DECISION = (
    "ok",
    "admitted",
    "bucket",
    "padded_tokens",
    "non_padded_cpu",
    "gaps",
    "count",
)


class CannotRun(Exception):
    """A harness cannot run (bad input, no DSpark, port in use...)."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    dp: int = 4
    ep_sizes: tuple[int, ...] = (1, 4)
    #: Attention-TP ranks per DP rank (the world is ``dp * attn_tp``).
    attn_tp: int = 1
    steps: int = 2000
    seed: int = 0
    fix: bool = True
    port: int = 0
    timeout_s: float = 60.0
    #: The consensus watch in every rank (:mod:`sglang_dspark_dp.watch`),
    #: hooked after the repair, over each draft runner's TP group (the
    #: world, a ``GroupCoordinator`` on gloo): its mode (``exit`` or
    #: ``log``); None: off.
    watch: str | None = None

    @property
    def world(self) -> int:
        return self.dp * self.attn_tp

    def validate(self) -> None:
        if isinstance(self.dp, bool) or not isinstance(self.dp, int):
            raise CannotRun(f"--dp must be an integer, got {self.dp!r}")
        if not 2 <= self.dp <= MAX_DP:
            raise CannotRun(
                f"--dp must be between 2 and {MAX_DP} (DP attention needs at least "
                f"2 ranks), got {self.dp}"
            )
        if (
            isinstance(self.attn_tp, bool)
            or not isinstance(self.attn_tp, int)
            or not 1 <= self.attn_tp <= MAX_DP // self.dp
        ):
            raise CannotRun(
                f"attn_tp must be an integer between 1 and {MAX_DP // self.dp} "
                f"(at most {MAX_DP} ranks in all), got {self.attn_tp!r}"
            )
        if self.steps < 1:
            raise CannotRun(f"--steps must be at least 1, got {self.steps!r}")
        if self.watch is not None and self.watch not in ("exit", "log"):
            raise CannotRun(f"watch must be 'exit', 'log' or None, got {self.watch!r}")
        for ep in self.ep_sizes:
            if ep < 1 or ep > self.world:
                raise CannotRun(
                    f"EP size must be between 1 and the number of ranks "
                    f"({self.world}), got {ep!r}"
                )


@dataclasses.dataclass
class Failure:
    step: int
    ep: int
    kind: str  # "disagreement" | "crash" | "wrong value"
    rank: int | None
    detail: str
    values: dict[str, Any]

    def render(self) -> str:
        where = "" if self.rank is None else f", rank {self.rank}"
        vals = "; ".join(f"{k}={v}" for k, v in self.values.items())
        return (
            f"{self.kind} at step {self.step} (EP {self.ep}{where}): {self.detail}"
            + (f" [{vals}]" if vals else "")
        )


@dataclasses.dataclass
class RunResult:
    config: RunConfig
    sglang_version: str
    plugin: str
    steps_done: dict[int, int]
    tiers: dict[int, Counter]
    failure: Failure | None
    seconds: float
    #: The SGLang function that wrote the sync sizes into every step's batch.
    sync_writer: str = SYNC_WRITER
    #: Rank -> the watch's alarm lines there (``watch="log"``).
    alarms: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.failure is None


def tier_of(max_count: int, capture: list[int]) -> str:
    if max_count == 0:
        return "0 (all idle)"
    if max_count > capture[-1]:
        return f">{capture[-1]} (eager)"
    for lo, hi in ((1, 8), (9, 32), (33, 64), (65, capture[-1])):
        if lo <= max_count <= hi:
            return f"{lo}-{hi}"
    return str(max_count)


# --------------------------------------------------------------------------
# Rank process.
# --------------------------------------------------------------------------


def _gather_ints(dist, values: list[int], world: int) -> list[list[int]]:
    import torch

    local = torch.tensor(values, dtype=torch.int64)
    out = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(out, local)
    return [t.tolist() for t in out]


#: Test hook: ``SGLANG_DSPARK_DP_FAULT=die:RANK:EP:STEP`` makes that rank's
#: process exit abruptly at that step, to prove the run then ends with a clear
#: message and no process left behind; ``skew:RANK:EP:STEP:FIELD`` adds one to
#: that rank's FIELD (one of :data:`JUDGED`) of that step's decision, as a
#: rank that decided differently would, to prove the verdict names it;
#: ``sizes:RANK:EP:STEP`` makes that rank see the first DP rank's count one
#: higher in that step's gathered sync sizes (an input of the draft batch's
#: decisions perturbed on one rank, for the watch to name).
FAULT_ENV = "SGLANG_DSPARK_DP_FAULT"
#: The decision fields the ranks are judged on (:func:`_judge`).
JUDGED = ("admitted", "bucket", "padded_tokens", "non_padded_cpu", "gaps")


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # "die" | "skew" | "sizes"
    rank: int
    ep: int
    step: int
    field: str | None = None

    def at(self, rank: int, ep: int, step: int) -> bool:
        return (self.rank, self.ep, self.step) == (rank, ep, step)


def _fault() -> Fault | None:
    """The test hook's fault, or None; CannotRun naming the value if it is
    not one."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    kind, _, rest = spec.partition(":")
    parts = rest.split(":")
    fields = JUDGED
    try:
        if kind in ("die", "sizes") and len(parts) == 3:
            return Fault(kind, *(int(x) for x in parts))
        if kind == "skew" and len(parts) == 4 and parts[3] in fields:
            return Fault("skew", *(int(x) for x in parts[:3]), field=parts[3])
    except ValueError:
        pass
    raise CannotRun(
        f"{FAULT_ENV} must be die:RANK:EP:STEP, sizes:RANK:EP:STEP or "
        f"skew:RANK:EP:STEP:FIELD "
        f"(FIELD one of {', '.join(fields)}), got {spec!r}"
    )


def _rank_main(rank: int, cfg: RunConfig, port: int, results, progress) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        from sglang_dspark_dp.harness import world

        world.join(rank, cfg.world, port, cfg.timeout_s)
    except Exception as exc:
        results.put(("error", rank, f"could not join the gloo group: {exc}"))
        return
    try:
        _rank_loop(rank, cfg, results, progress, dist)
    except Exception as exc:
        results.put(("error", rank, "".join(traceback.format_exception(exc))[-2000:]))
    finally:
        if cfg.watch is not None:
            results.put(("alarms", rank, tuple(world.watch_off())))
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _rank_loop(rank, cfg: RunConfig, results, progress, dist) -> None:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH, MAX_CAPTURE_BS
    from sglang_dspark_dp.harness.churn import RankChurn
    from sglang_dspark_dp.srt.speculative.dspark_components import dspark_draft

    api = adapter.load_sglang_api()
    writer = adapter.load_sync_writer()
    repair = dspark_draft.REPAIR
    if cfg.fix:
        st = repair.instrument(apply=True)
        if not st.healthy:
            raise RuntimeError(st.line())
        plugin = "repaired" if st.enabled else "not needed (stock is complete)"
        names = repair.probe_result.names
    else:
        repair.uninstrument()
        plugin = "off (--no-fix)"
        names = dspark_draft.probe(api).names
    tp_group = None
    if cfg.watch is not None:
        from sglang_dspark_dp.harness import groups, world

        world.watch_on(cfg.watch)
        tp_group = groups.make_group(
            [list(range(cfg.world))], rank, name="tp", timeout_s=cfg.timeout_s
        )
    capture = adapter.capture_sizes(MAX_CAPTURE_BS)
    graph = adapter.graph_runner(
        api, dp_size=cfg.dp, width=DRAFT_WIDTH, capture_bs=capture
    )
    tiers: dict[int, Counter] = {}
    steps_done: dict[int, int] = {}
    failure: Failure | None = None
    world = cfg.world
    dp_rank, attn_rank = divmod(rank, cfg.attn_tp)
    topology = dict(
        dp_size=cfg.dp,
        dp_rank=dp_rank,
        attn_tp_size=cfg.attn_tp,
        attn_tp_rank=attn_rank,
    )
    fault = _fault()
    for ep in cfg.ep_sizes:
        tiers[ep] = Counter()
        steps_done[ep] = 0
        churn = RankChurn(seed=cfg.seed, rank=dp_rank, dp=cfg.dp, steps=cfg.steps)
        driver, wants_device = draft_driver(
            api, graph=graph, names=names, ep=ep, **topology
        )
        if tp_group is not None:
            driver.runner.tp_group = tp_group  # as SGLang's ModelRunner keeps it
        # One collective per step: this step's sync sizes travel with the
        # previous step's decisions (judged one step late, by every rank
        # alike, so all ranks still stop at the same step).
        pending: tuple[int, list[int], str] | None = None
        prev_counts: list[int] = []
        for t in range(cfg.steps + 1):
            if fault is not None and fault.kind == "die" and fault.at(rank, ep, t):
                os._exit(17)  # the documented test hook: this rank dies here
            count = churn.count(t) if t < cfg.steps else 0
            message = [count, count, 1] + (
                pending[1] if pending else [1] + [0] * (len(DECISION) - 1)
            )
            gathered = _gather_ints(dist, message, world)
            if pending is not None:
                pt, _, ptext = pending
                everyone = [g[3:] for g in gathered]
                failure = _judge(
                    pt, ep, everyone, prev_counts, driver.width, cfg.attn_tp
                )
                if failure is not None and failure.rank is not None:
                    texts: list[Any] = [None] * world
                    dist.all_gather_object(texts, ptext)
                    if texts[failure.rank]:
                        failure.detail = f"{failure.detail}: {texts[failure.rank]}"
                if failure is not None:
                    break
                steps_done[ep] += 1
                if rank == 0:
                    idle = sum(1 for c in prev_counts if c == 0)
                    mode = "graph" if everyone[0][1] else "eager"
                    tiers[ep][
                        (tier_of(max(prev_counts), capture), idle, mode, "yes")
                    ] += 1
                    progress.value += 1
            if t == cfg.steps:
                break
            # One row per DP rank: its first attention-TP rank's.
            sync = [g[:3] for g in gathered[:: cfg.attn_tp]]
            counts = [g[0] for g in sync]
            if fault is not None and fault.kind == "sizes" and fault.at(rank, ep, t):
                sync = [list(row) for row in sync]
                sync[0][0] += 1  # the test hook: this rank alone sees it
            decision, text = draft_decision(
                api,
                writer,
                driver,
                sync,
                dp_rank,
                cfg,
                ep,
                capture,
                wants_device,
                attn_rank=attn_rank,
            )
            if fault is not None and fault.kind == "skew" and fault.at(rank, ep, t):
                decision[DECISION.index(fault.field)] += 1  # the test hook
            pending = (t, decision, text)
            prev_counts = counts
        if failure is not None:
            break
    if rank == 0:
        results.put(("done", rank, (plugin, steps_done, tiers, failure)))


def draft_driver(
    api: Any,
    *,
    graph: Any,
    names: Any,
    ep: int,
    dp_size: int,
    dp_rank: int,
    attn_tp_size: int = 1,
    attn_tp_rank: int = 0,
) -> tuple[Any, bool]:
    """One rank's draft driver (the real proposer over ``graph``, the real
    ``DecodeCudaGraphRunner``), built under its DP/EP topology, and whether
    the release wants the device non-padded count."""
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH
    from sglang_dspark_dp.drivers.draft import DraftDriver

    with adapter.parallel_override(
        api.get_parallel,
        ep_size=ep,
        dp_size=dp_size,
        dp_rank=dp_rank,
        attn_tp_size=attn_tp_size,
        attn_tp_rank=attn_tp_rank,
    ):
        driver = DraftDriver(
            api, gamma=DRAFT_WIDTH, dp_moe_sync=dp_size > 1, graph=graph, names=names
        )
        wants_device = bool(api.enable_num_token_non_padded())
    return driver, wants_device


def draft_decision(
    api,
    writer,
    driver,
    sync,
    rank,
    cfg,
    ep,
    capture,
    wants_device,
    *,
    attn_rank=0,
    raised: list[BaseException] | None = None,
):
    """Build this rank's draft batch for one step (``rank``: its DP rank,
    ``attn_rank``: its place among that DP rank's attention-TP ranks);
    return its decision vector (see :data:`DECISION`) and a text: the error
    if it raised (the exception appended to ``raised`` when given), else the
    wrong fields (empty when the batch is correct)."""
    import torch

    from sglang_dspark_dp import adapter, expectations
    from sglang_dspark_dp.drivers.builders import make_schedule_batch
    from sglang_dspark_dp.drivers.draft import padded_bs

    count = sync[rank][0]
    counts = [row[0] for row in sync]
    decision = [1, 0, 0, 0, -1, 0, count]
    with adapter.parallel_override(
        api.get_parallel,
        dp_size=cfg.dp,
        dp_rank=rank,
        ep_size=ep,
        attn_tp_size=cfg.attn_tp,
        attn_tp_rank=attn_rank,
    ):
        try:
            seq_lens = torch.full((count,), 16, dtype=torch.int64)
            batch = make_schedule_batch(api, seq_lens=seq_lens, global_num_tokens=None)
            adapter.write_sync_sizes(writer, batch, sync, rank)
            seen = driver.step_batch(count, batch)
            if seen is None:
                raise RuntimeError("the draft runner received no batch")
            f = seen.fields
            width = driver.width
            gaps = expectations.check(
                f,
                expectations.expect(
                    tokens=expectations.draft_tokens(count, width),
                    counts=counts,
                    width=width,
                    device_count=wants_device,
                    rank=rank,
                ),
            )
            admitted = bool(seen.admitted)
            unscaled = f.get("unscaled")
            max_unscaled = max(unscaled) if isinstance(unscaled, list) else 0
            bucket = (padded_bs(capture, max_unscaled) or 0) if admitted else 0
            scaled = f.get("scaled_cpu") or [0]
            padded = bucket * width if admitted else max(scaled)
            cpu = f.get("non_padded_cpu")
            decision = [
                1,
                int(admitted),
                bucket,
                padded,
                cpu if isinstance(cpu, int) else -1,
                len(gaps),
                count,
            ]
            text = "; ".join(g.render(driver.runner.names) for g in gaps)
        except Exception as exc:
            decision[0] = 0
            if raised is not None:
                raised.append(exc)
            return decision, f"{type(exc).__name__}: {exc}"
    return decision, text


def _judge(t, ep, everyone, counts, width, attn_tp: int = 1) -> Failure | None:
    """Compare the ranks' decisions of one step (every rank computes the
    same verdict from the same gathered data; ``counts``: one per DP rank,
    ``attn_tp`` ranks each)."""
    from sglang_dspark_dp.expectations import draft_tokens

    col = {key: i for i, key in enumerate(DECISION)}
    for r, d in enumerate(everyone):
        if d[col["ok"]] == 0:
            return Failure(t, ep, "crash", r, "the step raised", {"counts": counts})
    keys = ("admitted", "bucket", "padded_tokens")
    if attn_tp > 1:  # the ranks of one DP rank must also match each other
        keys = (*keys, "non_padded_cpu")
    for key in keys:
        values = [d[col[key]] for d in everyone]
        if key == "non_padded_cpu":
            values = [d[col[key]] for d in everyone]
            firsts = values[::attn_tp]
            odd = next(
                (r for r, v in enumerate(values) if v != firsts[r // attn_tp]), None
            )
            if odd is not None:
                return Failure(
                    t,
                    ep,
                    "disagreement",
                    odd,
                    "the attention-TP ranks of one DP rank disagree on non_padded_cpu",
                    {key: values, "counts": counts},
                )
            continue
        if len(set(values)) != 1:
            odd = next(r for r, v in enumerate(values) if v != values[0])
            return Failure(
                t,
                ep,
                "disagreement",
                odd,
                f"ranks disagree on {key}",
                {key: values, "counts": counts},
            )
    for r, d in enumerate(everyone):
        if d[col["gaps"]]:
            return Failure(
                t,
                ep,
                "wrong value",
                r,
                f"{d[col['gaps']]} field(s) of the draft batch are wrong",
                {"counts": counts},
            )
    total = sum(d[col["non_padded_cpu"]] for d in everyone[::attn_tp])
    want = sum(draft_tokens(c, width) for c in counts)
    if total != want:
        return Failure(
            t,
            ep,
            "wrong value",
            None,
            "EP accounting: non-padded sum",
            {"expected": want, "got": total},
        )
    return None


# --------------------------------------------------------------------------
# Parent.
# --------------------------------------------------------------------------


def free_port(port: int) -> int:
    """``port`` (0: any free one) on loopback, or CannotRun if it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CannotRun(f"loopback port {port} is in use ({exc.strerror})") from exc
        return s.getsockname()[1]


def _dead(procs) -> str:
    for i, p in enumerate(procs):
        if p.exitcode not in (None, 0):
            return f"DP rank {i} died (exit code {p.exitcode})"
    return ""


def run(cfg: RunConfig, *, on_progress=None) -> RunResult:
    """Run the harness; raises :class:`CannotRun` for exit-2 conditions."""
    cfg.validate()
    _fault()  # a bad test hook is refused here, in one line
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version

    try:
        adapter.load_sglang_api()
        adapter.load_sync_writer()  # SGLang's own sync path, or cannot run
    except DidNotEnable as exc:
        raise CannotRun(str(exc)) from exc
    port = free_port(cfg.port)
    method = os.environ.get(START_METHOD_ENV, "fork")
    ctx = mp.get_context(method)
    results = ctx.Queue()
    progress = ctx.Value("l", 0)
    procs = [
        ctx.Process(
            target=_rank_main, args=(r, cfg, port, results, progress), daemon=True
        )
        for r in range(cfg.world)
    ]
    start = time.monotonic()
    total = cfg.steps * len(cfg.ep_sizes)
    # A generous wall-clock bound: start-up plus a few ms per rank-step.
    deadline = start + 120 + total * cfg.world * 0.02 + cfg.timeout_s
    outcome = None
    alarms: dict[int, tuple[str, ...]] = {}
    try:
        for p in procs:
            p.start()
        while outcome is None:
            try:
                kind, rank, payload = results.get(timeout=0.2)
            except queue.Empty:
                kind = None
            if on_progress is not None:
                on_progress(progress.value, total)
            if kind == "alarms":
                alarms[rank] = payload
            if kind == "done":
                outcome = payload
                break
            if kind == "error":
                # A peer's collective fails as soon as a rank dies; name the
                # rank that died if there is one, not the peer that noticed.
                time.sleep(0.5)
                last = payload.strip().splitlines()[-1] if payload.strip() else payload
                died = _dead(procs)
                if died:
                    raise CannotRun(f"{died}; DP rank {rank} then failed: {last}")
                raise CannotRun(f"DP rank {rank} failed: {last}")
            died = _dead(procs)
            if died:
                raise CannotRun(died)
            if time.monotonic() > deadline:
                raise CannotRun(
                    f"the run did not finish within {deadline - start:.0f} s"
                )
        for p in procs:
            p.join(timeout=cfg.timeout_s)
        if cfg.watch is not None:
            _collect_alarms(results, cfg, procs, alarms)
    finally:
        stop(procs, results)
    if on_progress is not None:
        on_progress(progress.value, total)
    plugin, steps_done, tiers, failure = outcome
    return RunResult(
        config=cfg,
        sglang_version=installed_sglang_version() or "unknown",
        plugin=plugin,
        steps_done=steps_done,
        tiers=tiers,
        failure=failure,
        seconds=time.monotonic() - start,
        alarms=alarms,
    )


def _collect_alarms(
    results: Any, cfg: RunConfig, procs: list[Any], alarms: dict[int, Any]
) -> None:
    """Every rank's watch alarms into ``alarms``, as the ranks sent them
    when they stopped (a rank that never sent any is missing)."""
    deadline = time.monotonic() + cfg.timeout_s
    while len(alarms) < cfg.world and time.monotonic() < deadline:
        try:
            kind, rank, payload = results.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                return
            continue
        if kind == "alarms":
            alarms[rank] = payload
