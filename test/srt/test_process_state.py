"""A probe's answer never depends on the process that asks.

``doctor --json``'s verdicts (every repair's outcome and reason, every
upstream change's state) in a fresh process are the reference; the same
report must come back in a process whose default ``torch.distributed``
group (gloo, 2 ranks) was initialised before the plugin loaded, or after;
with no GPU visible (``CUDA_VISIBLE_DEVICES=""``); and with a torch default
device set (``meta``: a probe that made a tensor without saying where would
get one with no data). And the probes leave every piece of process state
they touch as they found it: torch's default device and dtype, grad mode,
``torch.distributed``'s default group, SGLang's parallel context and the
environment. Each runs in a fresh process forked from one that
imported SGLang and nothing of the plugin, as ``sglang serve`` starts.
"""

from __future__ import annotations

import json
import socket
import textwrap

import pytest
from known_releases import backport_fixes
from srt_helpers import run_python

REPORT = textwrap.dedent(
    """
    import json
    def report(tag):
        from sglang_dspark_dp.cli.doctor import doctor_report
        r = doctor_report()
        out = {
            "repairs": [(s["repair"], s["outcome"], s["reason"]) for s in r["repairs"]],
            "changes": [(c["change"], c["state"]) for c in r["changes"]],
        }
        print("REPORT", tag, json.dumps(out), flush=True)
    """
)

#: Two ranks of a gloo default group: rank 1 is a fork of rank 0; both
#: report. ``{order}`` is "before" or "after" load_plugins().
GROUP = textwrap.dedent(
    """
    import os
    import torch.distributed as dist
    from sglang.srt.plugins import load_plugins
    rank = 0 if os.fork() else 1
    def join():
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
    if "{order}" == "before":
        join()
        load_plugins()
    else:
        load_plugins()
        join()
    assert dist.is_initialized() and dist.get_world_size() == 2
    for turn in range(2):  # one rank at a time: they share this stdout
        if turn == rank:
            report(f"rank{{rank}}")
        dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        os._exit(0)
    os.wait()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reports(proc) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("REPORT "):
            _, tag, payload = line.split(" ", 2)
            out[tag] = json.loads(payload)
    return out


@pytest.fixture(scope="module")
def fresh():
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    got = reports(run_python(REPORT + "report('fresh')\n"))["fresh"]
    assert got["repairs"] and got["changes"]
    # Every repair decided: none failed to set up in a fresh process.
    assert all("could not" not in reason for _, _, reason in got["repairs"]), got
    return got


@pytest.mark.parametrize("order", ["before", "after"])
def test_torch_distributed_initialised_around_the_load(fresh, order):
    proc = run_python(REPORT + GROUP.format(port=free_port(), order=order), timeout=300)
    got = reports(proc)
    assert set(got) == {"rank0", "rank1"}, proc.stdout[-2000:]
    assert got["rank0"] == fresh
    assert got["rank1"] == fresh


def test_no_gpu_visible(fresh):
    got = reports(
        run_python(REPORT + "report('nogpu')\n", env={"CUDA_VISIBLE_DEVICES": ""})
    )
    assert got["nogpu"] == fresh


def test_a_default_device_set(fresh):
    code = "import torch\ntorch.set_default_device('meta')\n" + REPORT
    got = reports(run_python(code + "report('meta')\n"))
    assert got["meta"] == fresh


#: The process state a probe may touch, as JSON: torch's default device,
#: dtype and grad mode, ``torch.distributed``'s default group, SGLang's
#: parallel context as a server reads it, and the environment.
STATE = textwrap.dedent(
    """
    import json, os
    import torch
    import torch.distributed as dist
    from sglang_dspark_dp import adapter
    def state():
        par = adapter.load_sglang_api().get_parallel()
        def read(name):
            try:
                return repr(getattr(par, name))
            except Exception as exc:
                return type(exc).__name__
        out = {
            "device": str(torch.get_default_device()),
            "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(),
            "dist": dist.is_initialized(),
            "parallel": {
                k: read(k)
                for k in ("tp_size", "tp_rank", "attn_tp_size", "attn_dp_size",
                          "attn_dp_rank", "moe_ep_size")
            },
            "env": dict(os.environ),
        }
        if dist.is_initialized():
            out["group"] = [
                id(dist.group.WORLD), dist.get_backend(),
                dist.get_world_size(), dist.get_rank(),
            ]
        return out
    def probe_and_compare(tag):
        from sglang.srt.plugins import load_plugins
        from sglang_dspark_dp.cli.doctor import doctor_report
        before = state()
        load_plugins()
        doctor_report()  # every repair's probe again, and judge's
        after = state()
        print("STATE", tag, json.dumps([before, after]), flush=True)
    """
)

#: A job that set its own defaults before building an Engine.
DEFAULTS = textwrap.dedent(
    """
    torch.set_default_device("meta")
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    """
)


def states(proc) -> dict[str, list[dict]]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("STATE "):
            _, tag, payload = line.split(" ", 2)
            out[tag] = json.loads(payload)
    return out


def test_the_probes_leave_a_fresh_process_as_they_found_it():
    """A process with its own default device (``meta``), default dtype and
    grad mode, no ``torch.distributed``: after the plugin's load and every
    probe, each is what it was (and no group was initialised)."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    got = states(run_python(STATE + DEFAULTS + "probe_and_compare('fresh')\n"))
    before, after = got["fresh"]
    assert before["device"] == "meta" and before["dtype"] == "torch.float64"
    assert before["grad"] is False and before["dist"] is False
    assert after == before


def test_the_probes_leave_a_distributed_job_as_they_found_it():
    """Two ranks of a gloo default group (rank 1 a fork of rank 0), with
    their own defaults: the probes leave the group, its backend, size and
    ranks, and every default, as they were."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    code = STATE + textwrap.dedent(
        f"""
        rank = 0 if os.fork() else 1
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=rank,
            world_size=2,
        )
        """
    )
    code += DEFAULTS + textwrap.dedent(
        """
        for turn in range(2):  # one rank at a time: they share this stdout
            if turn == rank:
                probe_and_compare(f"rank{rank}")
            dist.barrier()
        dist.destroy_process_group()
        if rank == 1:
            os._exit(0)
        os.wait()
        """
    )
    got = states(run_python(code, timeout=300))
    assert set(got) == {"rank0", "rank1"}
    for rank, (before, after) in enumerate([got["rank0"], got["rank1"]]):
        assert before["device"] == "meta" and before["dist"] is True
        assert before["group"][1:] == ["gloo", 2, rank]
        assert after == before, rank
