"""Backport mode: an SGLang build that carries upstream changes is judged
on its own, one verdict per change.

A maintainer who cherry-picks #33098 onto a 0.5.16 branch runs
``nox -s backport -- PATH 33098``: the plugin stays off, and
``sglang-dspark-dp judge`` and the regression suite judge the build by its
behaviour. Here the "patched build" is the installed release with a
stand-in for #33098 written for this test (what that change adds to the DP
fill: the unscaled counts and the non-padded counts, the device one made
from the host count, and the draft module's name for SGLang's switch),
applied in the fresh process before anything runs; stock is the installed
release as it is.
"""

from __future__ import annotations

import json

import pytest
from known_releases import BACKPORT_ENV, KNOWN, OUT
from srt_helpers import CLI, run_python

from sglang_dspark_dp import upstream
from sglang_dspark_dp.settings import DISABLE_ENV

#: #33098, as a maintainer's build of 0.5.16 would carry it (written for
#: this test): after the release's own DP fill, the fields it leaves unset.
STAND_IN_33098 = """
import torch
from sglang.srt.model_executor import forward_batch_info as _fbi
from sglang.srt.speculative.dspark_components import dspark_draft as _draft

_draft.enable_num_token_non_padded = _fbi.enable_num_token_non_padded
_release_fill = _draft.DraftBlockProposer._fill_dp_moe_sync_metadata

def _fill_with_33098(self, forward_batch, batch):
    _release_fill(self, forward_batch, batch)
    if not self._dp_moe_sync or batch.global_num_tokens is None:
        return
    forward_batch.original_global_num_tokens_cpu = batch.global_num_tokens
    tokens = forward_batch.input_ids.numel()
    if _draft.enable_num_token_non_padded():
        forward_batch.num_token_non_padded = torch.tensor(
            tokens, dtype=torch.int32, device=self.draft_model_runner.device
        )
    forward_batch.num_token_non_padded_cpu = tokens

_draft.DraftBlockProposer._fill_dp_moe_sync_metadata = _fill_with_33098
"""

DRAFT_CHANGES = ("dp-draft-metadata", "tp-draft-non-padded", "dp-fill-no-host-wait")
JUDGE = ["judge", "--fixes", "draft-batch", "--steps", "40"]
SUITE = (
    "import sys, pytest\n"
    "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
    "'-W', 'ignore::UserWarning', 'test/srt/test_dspark_dp_attention.py']))\n"
)
BACKPORT = {BACKPORT_ENV: "33098", DISABLE_ENV: "1"}


def lacks_33098(version: str) -> None:
    row = KNOWN.get(version)
    if row is None:
        pytest.fail(f"sglang {version} is not recorded in known_releases.py")
    if row["dp-draft-metadata"] is not OUT:
        pytest.skip(f"sglang {version} ships #33098: nothing to backport")


def judged(stdout: str) -> dict[str, str]:
    """``{change: state}`` from ``judge``'s lines."""
    out = {}
    for change in upstream.CHANGES:
        head = f"judge: {change.label}"
        if change.label != change.key:
            head += f" {change.key}"
        for line in stdout.splitlines():
            if line.startswith(head + ": "):
                out[change.key] = line[len(head) + 2 :].split(":")[0]
    return out


def test_judge_gives_the_recorded_verdicts(sglang_version):
    """Every release, stock, every change: judge's states are the recorded
    row, and its exit says whether any change is missing."""
    row = KNOWN.get(sglang_version)
    if row is None:
        pytest.fail(f"sglang {sglang_version} is not recorded in known_releases.py")
    proc = run_python(CLI.format(argv=["judge", "--json", "--steps", "40"]))
    missing = any(s is OUT for s in row.values())
    assert proc.returncode == (1 if missing else 0), proc.stdout + proc.stderr[-2000:]
    got = {v["change"]: v["state"] for v in json.loads(proc.stdout)}
    assert got == {k: s.value for k, s in row.items()}


def test_a_33098_backport_is_judged_in_that_change_alone(sglang_version):
    lacks_33098(sglang_version)
    proc = run_python(STAND_IN_33098 + CLI.format(argv=JUDGE))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    states = judged(proc.stdout)
    assert states == {
        "dp-draft-metadata": "in this build",
        "tp-draft-non-padded": "not in this build",
        # #33098's own fill makes a device tensor from the host count.
        "dp-fill-no-host-wait": "not in this build",
    }, proc.stdout
    assert "2 DP ranks agreed for 80 steps" in proc.stdout
    assert "judge: FAILED: 2 of 3 changes not in this build" in proc.stdout


def test_stock_lacks_33098_and_judge_names_the_crash(sglang_version):
    lacks_33098(sglang_version)
    proc = run_python(CLI.format(argv=JUDGE))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert judged(proc.stdout)["dp-draft-metadata"] == "not in this build"
    assert "stock DSpark crashes under DP attention" in proc.stdout


def test_judge_passes_a_build_judged_on_what_it_carries(sglang_version):
    lacks_33098(sglang_version)
    proc = run_python(
        STAND_IN_33098 + CLI.format(argv=["judge", "--fixes", "33098", "--steps", "40"])
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "judge: OK" in proc.stdout


def test_backport_mode_suite_passes_the_patched_build_only(sglang_version):
    lacks_33098(sglang_version)
    patched = run_python(STAND_IN_33098 + SUITE, env=BACKPORT, timeout=600)
    assert patched.returncode == 0, patched.stdout[-3000:] + patched.stderr[-2000:]
    assert " passed" in patched.stdout
    stock = run_python(SUITE, env=BACKPORT, timeout=600)
    assert stock.returncode == 1, stock.stdout[-3000:]
    assert "'NoneType' object is not iterable" in stock.stdout


@pytest.mark.parametrize("fixes", ["draft-batch,nope", "#1", ""])
def test_judge_refuses_an_unknown_change(fixes):
    proc = run_python(CLI.format(argv=["judge", "--fixes", fixes]))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--fixes: unknown change" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert all(k in proc.stderr for k in DRAFT_CHANGES)
