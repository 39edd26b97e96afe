"""Backport mode: an SGLang build that carries a fix is judged on its own.

A maintainer who cherry-picks the draft-batch fix onto a release branch
runs ``nox -s backport -- PATH draft-batch``: the plugin stays off,
``sglang-dspark-dp judge`` and the regression suite judge the build by its
behaviour. Here the "patched build" is the installed release with a
stand-in fill written for this test (it sets the fields the stock fill
misses, as a backport would), applied in the fresh process before anything
runs; stock is the installed release as it is.
"""

from __future__ import annotations

import pytest
from known_releases import BACKPORT_ENV, KNOWN
from srt_helpers import CLI, run_python

from sglang_dspark_dp.settings import DISABLE_ENV

#: A backport of the draft-batch fix, as a maintainer's build would carry
#: it: after the release's own fill, the fields it leaves unset.
STAND_IN_BACKPORT = """
import torch
from sglang.srt.model_executor import forward_batch_info as _fbi
from sglang.srt.speculative.dspark_components import dspark_draft as _draft

_release_fill = _draft.DraftBlockProposer._fill_dp_moe_sync_metadata

def _backported_fill(self, forward_batch, batch):
    _release_fill(self, forward_batch, batch)
    tokens = forward_batch.input_ids.numel()
    switch = getattr(_draft, "enable_num_token_non_padded", None)
    if (switch or _fbi.enable_num_token_non_padded)():
        forward_batch.num_token_non_padded = torch.full(
            (), tokens, dtype=torch.int32, device=self.draft_model_runner.device
        )
    forward_batch.num_token_non_padded_cpu = tokens
    if self._dp_moe_sync and batch.global_num_tokens is not None:
        forward_batch.original_global_num_tokens_cpu = batch.global_num_tokens

_draft.DraftBlockProposer._fill_dp_moe_sync_metadata = _backported_fill
"""

JUDGE = ["judge", "--fixes", "draft-batch", "--steps", "40"]
SUITE = (
    "import sys, pytest\n"
    "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', "
    "'-W', 'ignore::UserWarning', 'test/srt/test_dspark_dp_attention.py']))\n"
)
BACKPORT = {BACKPORT_ENV: "draft-batch", DISABLE_ENV: "1"}


def needs_the_fix(version: str) -> bool:
    row = KNOWN.get(version)
    if row is None:
        pytest.skip(f"sglang {version} is not recorded")
    return row["dp"] or row["local"]


def test_judge_names_the_crash_on_a_release_without_the_fix(sglang_version):
    if not needs_the_fix(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries the draft-batch fix")
    proc = run_python(CLI.format(argv=JUDGE))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "judge: draft-batch: NOT fixed in this build" in proc.stdout
    assert "misses num_token_non_padded" in proc.stdout
    crashes = "stock DSpark crashes under DP attention" in proc.stdout
    assert crashes is KNOWN[sglang_version]["dp"]
    assert "judge: FAILED" in proc.stdout


def test_judge_passes_a_build_that_carries_the_fix(sglang_version):
    backported = needs_the_fix(sglang_version)
    code = (STAND_IN_BACKPORT if backported else "") + CLI.format(argv=JUDGE)
    proc = run_python(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "judge: draft-batch: fixed in this build" in proc.stdout
    assert "judge: OK" in proc.stdout


def test_backport_mode_suite_passes_the_patched_build_only(sglang_version):
    if not needs_the_fix(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries the draft-batch fix")
    patched = run_python(STAND_IN_BACKPORT + SUITE, env=BACKPORT, timeout=600)
    assert patched.returncode == 0, patched.stdout[-3000:] + patched.stderr[-2000:]
    assert " passed" in patched.stdout
    stock = run_python(SUITE, env=BACKPORT, timeout=600)
    assert stock.returncode == 1, stock.stdout[-3000:]
    if KNOWN[sglang_version]["dp"]:
        assert "'NoneType' object is not iterable" in stock.stdout


def test_judge_refuses_an_unknown_fix():
    proc = run_python(CLI.format(argv=["judge", "--fixes", "draft-batch,nope"]))
    assert proc.returncode == 2
    assert "--fixes must name one or more of" in proc.stderr and "nope" in proc.stderr
