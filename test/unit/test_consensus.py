"""The ranks' agreement on a repair that adds a collective: it communicates
only over a real process group, never over a stand-in's token, whatever
state ``torch.distributed`` is in; and never inside a probe.

Each case runs in a fresh interpreter with a one-rank gloo default group
(this process must not hold one: the harnesses fork their ranks from it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import tempfile
    import torch.distributed as dist
    from sglang_dspark_dp.consensus import GroupVerdict
    from sglang_dspark_dp.isolation import is_process_group, probing

    store = tempfile.mktemp()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    token = object()
    real = dist.new_group([0])
    calls = []
    reduce = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(kwargs.get("group"))
        return reduce(*args, **kwargs)

    dist.all_reduce = counted
    assert not is_process_group(token) and not is_process_group(None)
    assert is_process_group(real)
    # A stand-in's token: the local verdict, no collective.
    assert GroupVerdict("x", True).agree(token, 2) is True
    assert GroupVerdict("x", False).agree(token, 2) is False
    assert calls == []
    # Inside a probe: no collective, even over a real group.
    with probing():
        assert GroupVerdict("x", True).agree(real, 2) is True
    assert calls == []
    # A real group of several ranks: the ranks agree over it, once.
    verdict = GroupVerdict("x", True)
    assert verdict.agree(real, 2) is True
    assert verdict.agree(real, 2) is True
    assert calls == [real]
    print("OK")
    """
)


def test_agreement_communicates_only_over_a_real_group_outside_a_probe():
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")
