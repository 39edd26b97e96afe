"""CPU checks of the consensus watch's cost script (``bench_watch.py``):
one short run on two gloo ranks with the watch's real channel, its table
and JSON; its refusals of bad input. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from sglang_dspark_dp_bench.draft_metadata import bench_watch as bw


@pytest.mark.parametrize("draft, entry", [(False, False), (True, True)])
def test_a_short_run_measures_both_variants_per_round(tmp_path, capsys, draft, entry):
    out = tmp_path / "watch.json"
    argv = ["--ranks", "2", "--rounds", "2", "--steps", "40", "--warmup", "5"]
    argv += ["--draft"] if draft else []
    argv += ["--entry"] if entry else []
    assert bw.main([*argv, "--work-us", "200", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    want = ["compact-verify"]
    want += ["draft-batch"] if draft else []
    want += ["worker-entry"] if entry else []
    assert result["sites"] == want
    (row,) = result["rows"]
    assert row["ranks"] == 2 and len(row["rounds"]) == 2
    # Every 'on' step (warm-up included) handed the watch its decisions.
    on_steps = 2 * (40 + 5)
    assert row["decisions"].get("compact-verify budget") == on_steps, row
    assert row["decisions"].get("draft DP sync sizes") == (on_steps if draft else None)
    # The real entry hook ran on the same channel, every 'on' step.
    assert row["decisions"].get("worker step entry") == (on_steps if entry else None)
    for rd in row["rounds"]:
        assert rd["off_median_us"] >= 200 and rd["on_median_us"] >= 200
        assert rd["added_us"] == rd["on_median_us"] - rd["off_median_us"]
        assert rd["steps_ratio"] > 0
    table = capsys.readouterr().out
    assert table.count("\n| 2 ") == 2, table
    assert "goal: added <= 20 µs" in table


def test_the_watch_really_drains_in_the_run(monkeypatch):
    """Each rank's channel compared what it was given: a rank whose events
    differ from its peer's makes the run fail, so the 'on' rounds measure
    a watch that works."""
    real = bw._steps

    def skewed(steps, work_us, channel, **kwargs):
        import torch.distributed as dist

        if channel is not None and dist.get_rank() == 1:
            channel.next_step("extra")  # nothing else differs: steps agree
            from sglang_dspark_dp import watch

            channel.note(watch.Event("tier", 0, "odd", "odd", ()))
        return real(steps, work_us, channel, **kwargs)

    monkeypatch.setattr(bw, "_steps", skewed)
    monkeypatch.setenv("SGLANG_DSPARK_DP_WATCH", "log")
    with pytest.raises(SystemExit, match="the watch alarmed"):
        bw.main(["--ranks", "2", "--rounds", "1", "--steps", "10", "--work-us", "100"])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ranks", "1"], "--ranks: each must be between 2 and 16, got 1"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--work-us", "-1"], "must not be negative"),
    ],
)
def test_bad_input_is_one_line(argv, says):
    with pytest.raises(SystemExit, match=says):
        bw.main(argv)
