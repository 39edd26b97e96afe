"""The upstream changes the plugin speaks in: names, aliases, verdicts and
what a backport brings into a build (no SGLang needed)."""

from __future__ import annotations

import pytest

from sglang_dspark_dp import upstream
from sglang_dspark_dp.upstream import State


def test_every_change_has_one_key_and_its_numbers_as_aliases():
    keys = upstream.keys()
    assert len(keys) == len(set(keys))
    c = upstream.change("dp-draft-metadata")
    assert c.label == "#33098" and {"33098", "#33098", "#33286"} <= c.aliases()
    assert upstream.change("relay-wait").label == "relay-wait"
    assert upstream.change("non-overlap-pp-proxy").label == "#39262"


def test_resolve_takes_names_numbers_and_repairs_in_order_without_repeats():
    groups = {"draft-batch": ("dp-draft-metadata", "tp-draft-non-padded")}
    assert upstream.resolve("31195, #33098 ,draft-batch", groups) == [
        "verify-budget-broadcast",
        "dp-draft-metadata",
        "tp-draft-non-padded",
    ]


@pytest.mark.parametrize("names", ["", " , ", "nope", "33098,#1"])
def test_resolve_names_what_it_does_not_know(names):
    with pytest.raises(ValueError) as err:
        upstream.resolve(names)
    assert "unknown change" in str(err.value)
    assert "dp-draft-metadata (#33098)" in str(err.value)


def test_a_backport_of_33098_brings_the_host_wait_its_fill_makes():
    """0.5.16 is not affected by the DP fill's host wait (its fill has no
    device count); #33098's fill brings one in."""
    row = {
        "dp-draft-metadata": State.NOT_IN,
        "tp-draft-non-padded": State.NOT_IN,
        "dp-fill-no-host-wait": State.NOT_AFFECTED,
    }
    got = upstream.with_backports(row, ["dp-draft-metadata"])
    assert got == {
        "dp-draft-metadata": State.IN,
        "tp-draft-non-padded": State.NOT_IN,
        "dp-fill-no-host-wait": State.NOT_IN,
    }
    both = upstream.with_backports(row, ["dp-draft-metadata", "dp-fill-no-host-wait"])
    assert both["dp-fill-no-host-wait"] is State.IN
    assert upstream.with_backports(row, []) == row


def test_verdict_lines_name_the_label_and_the_key():
    v = upstream.Verdict("dp-draft-metadata", State.NOT_IN, "misses a field")
    assert v.line() == "#33098 dp-draft-metadata: not in this build: misses a field"
    assert upstream.Verdict("relay-wait", State.IN, "waits").line() == (
        "relay-wait: in this build: waits"
    )
    assert not State.NOT_IN.ok and State.IN.ok and State.NOT_AFFECTED.ok
