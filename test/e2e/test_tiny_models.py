"""CPU validation of the tiny DeepSeek-V4 target / DSpark draft configs.

Uses SGLang's own config loading and DSpark config parsing; skipped when
SGLang (0.5.16 or newer with DSpark) is not importable. The attention head
count is checked against what the installed release's decode path hands
FlashMLA's sparse decode kernel at every attention TP size the e2e runs use
(1: one GPU, and DP attention on 2 or 4; 2 and 4: plain TP).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("sglang")
hf_utils = pytest.importorskip("sglang.srt.utils.hf_transformers_utils")
model_config = pytest.importorskip("sglang.srt.configs.model_config")
dspark_config = pytest.importorskip(
    "sglang.srt.speculative.dspark_components.dspark_config"
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "e2e" / "models"
TARGET = MODELS / "tiny-dsv4-target"
DRAFT = MODELS / "tiny-dsv4-dspark-draft"
GPUS = (1, 2, 4)
ATTENTION_TP = (1, 2, 4)

_spec = importlib.util.spec_from_file_location("e2e_checks", ROOT / "e2e/e2e_checks.py")
e2e_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e_checks)

#: The query head counts FlashMLA's sparse fp8 decode kernel has variants
#: for: sgl_kernel's ``flashmla_ops`` raises "Unsupported h_q" for any other
#: (``sparse_decode_fwd``; seen as "Capture cuda graph failed" at 16 heads
#: on the H200), and SGLang's ``models/deepseek_v4.py`` says so where it pads
#: the per-rank heads ("only specializes h_q for {64, 128}").
FLASHMLA_SPARSE_DECODE_H_Q = (64, 128)


@pytest.fixture(scope="module")
def target():
    return hf_utils.get_config(str(TARGET), trust_remote_code=False)


@pytest.fixture(scope="module")
def draft():
    return hf_utils.get_config(str(DRAFT), trust_remote_code=False)


def test_both_are_deepseek_v4(target, draft):
    assert model_config.is_deepseek_v4(target)
    assert model_config.is_deepseek_v4(draft)
    assert target.architectures == ["DeepseekV4ForCausalLM"]
    assert draft.architectures == ["DeepseekV4ForCausalLMDSpark"]


@pytest.mark.parametrize("name", ["target", "draft"])
def test_shape_relations_the_model_code_asserts(name, request):
    c = request.getfixturevalue(name)
    # MqaAttentionBase: head_dim = rope + nope, one KV head, ratios in (0,4,128)
    assert c.head_dim == 512 and c.qk_rope_head_dim == 64
    assert c.head_dim - c.qk_rope_head_dim == 448  # DSV4 KV-pool layout assert
    assert c.num_key_value_heads == 1
    assert len(c.compress_ratios) >= c.num_hidden_layers
    assert set(c.compress_ratios) <= {0, 4, 128}
    assert c.rope_scaling["original_max_position_embeddings"] > 0
    for gpus in GPUS:
        assert c.n_routed_experts % gpus == 0  # EP
    for tp in ATTENTION_TP:
        # n_local_heads = n_heads // attn_tp; n_local_groups likewise
        assert c.num_attention_heads % tp == 0 and c.o_groups % tp == 0
        assert c.num_attention_heads * c.head_dim % c.o_groups == 0
    assert c.hc_mult == 4


def decode_head_padding() -> tuple[int, bool]:
    """The installed decode path's head padding: ``(pad_to, only_under_tp)``.

    Read from ``MQALayer``'s source: ``padded_num_heads = P if
    self.n_local_heads <= P else self.n_heads``, and whether an ``if
    self.<...>tp_size > 1:`` guards it (0.5.16 names the attention TP size
    ``self.tp_size``, 0.5.17 ``self.attn_tp_size``)."""
    from sglang.srt.models import deepseek_v4

    lines = inspect.getsource(deepseek_v4.MQALayer).splitlines()
    pad = re.compile(
        r"padded_num_heads = (\d+) if self\.n_local_heads <= (\d+) else self\.n_heads"
    )
    for i, line in enumerate(lines):
        m = pad.search(line)
        if m:
            assert m.group(1) == m.group(2), line
            before = "\n".join(lines[max(0, i - 8) : i])
            guarded = re.search(r"if self\.(attn_)?tp_size > 1:", before) is not None
            return int(m.group(1)), guarded
    pytest.skip("this release's MQALayer pads no decode heads where expected")


def test_the_tp_size_guard_is_the_attention_tp_size():
    from sglang.srt.models import deepseek_v4

    source = inspect.getsource(deepseek_v4.MQALayer)
    if "if self.tp_size > 1:" not in source:
        pytest.skip("this release's MQALayer has no `if self.tp_size > 1:` guard")
    assert "self.tp_size = self.attn_tp_size" in source


def decode_h_q(heads: int, attn_tp: int, pad_to: int, only_under_tp: bool) -> int:
    local = heads // attn_tp
    if only_under_tp and attn_tp == 1:
        return heads
    return pad_to if local <= pad_to else heads


@pytest.mark.parametrize("name", ["target", "draft"])
@pytest.mark.parametrize("attn_tp", ATTENTION_TP)
def test_flashmla_gets_a_head_count_it_has_a_kernel_for(name, attn_tp, request):
    c = request.getfixturevalue(name)
    pad_to, only_under_tp = decode_head_padding()
    assert pad_to in FLASHMLA_SPARSE_DECODE_H_Q
    h_q = decode_h_q(c.num_attention_heads, attn_tp, pad_to, only_under_tp)
    assert h_q in FLASHMLA_SPARSE_DECODE_H_Q, (c.num_attention_heads, attn_tp, h_q)


def test_the_padding_rule_rejects_the_old_sixteen_heads():
    """16 heads ran only where the heads are padded: at attention TP 1 the
    kernel got h_q 16 ("Unsupported h_q: 16" on the H200)."""
    pad_to, only_under_tp = decode_head_padding()
    assert only_under_tp  # both staged releases pad under attention TP > 1 only
    assert decode_h_q(16, 1, pad_to, only_under_tp) not in FLASHMLA_SPARSE_DECODE_H_Q
    assert decode_h_q(16, 2, pad_to, only_under_tp) == 64


def test_the_installed_kernel_and_model_state_the_h_q_fact():
    from sglang.srt.models import deepseek_v4

    stated = re.search(r"h_q for \{(\d+), (\d+)\}", inspect.getsource(deepseek_v4))
    if stated is None:
        pytest.skip("this release's deepseek_v4.py does not state the h_q variants")
    assert tuple(int(x) for x in stated.groups()) == FLASHMLA_SPARSE_DECODE_H_Q
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or spec.origin is None:
        pytest.skip("sgl_kernel is not installed in this Python")
    ops = list(Path(spec.origin).parent.glob("flashmla_ops*.so"))
    if not ops:
        pytest.skip("this sgl_kernel has no flashmla_ops")
    assert b"Unsupported h_q" in ops[0].read_bytes()


def test_draft_matches_target(target, draft):
    assert draft.vocab_size == target.vocab_size
    assert draft.hidden_size == target.hidden_size
    assert draft.compress_ratios == [0] * draft.num_hidden_layers


def test_parse_dspark_draft_config(draft, target):
    cfg = dspark_config.parse_dspark_draft_config(draft_hf_config=draft)
    assert cfg.require_markov() and cfg.markov_head_type == "vanilla"
    assert cfg.gamma == 4
    assert cfg.mask_token_id == target.vocab_size - 1
    assert cfg.target_layer_ids == [1, 3]
    assert len(cfg.target_layer_ids) == draft.num_hidden_layers  # one stage each
    assert all(0 <= i < target.num_hidden_layers for i in cfg.target_layer_ids)
    assert cfg.num_target_layers == target.num_hidden_layers


@pytest.mark.parametrize("num_draft_tokens", [None, 5])
def test_resolve_runtime_config(draft, target, num_draft_tokens):
    rt = dspark_config.resolve_runtime_config(
        draft_hf_config=draft,
        speculative_num_draft_tokens=num_draft_tokens,
        target_vocab_size=target.vocab_size,
    )
    assert (rt.gamma, rt.verify_num_draft_tokens) == (4, 5)
    assert rt.mask_token_id == target.vocab_size - 1


def test_tokenizer_covers_vocab_and_mask(target):
    tok = json.loads((TARGET / "tokenizer.json").read_text())
    ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
    assert ids == set(range(target.vocab_size))
    mask = [t for t in tok["added_tokens"] if t["content"] == "<|mask|>"]
    assert mask and mask[0]["id"] == target.vocab_size - 1


@pytest.mark.parametrize("spec", [True, False])
@pytest.mark.parametrize("gpus", GPUS)
def test_launch_flags_parse(gpus, spec):
    """The arguments run_e2e.sh starts each server with (one place:
    e2e_checks.server_args) parse with the installed ServerArgs."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = e2e_checks.server_args(
        gpus, spec, port=31000, target=str(TARGET), draft=str(DRAFT), graph_bs=8
    )
    assert args[0] == "serve"
    ns = parser.parse_args(args[1:])
    assert (ns.tp_size, ns.dp_size) == (gpus, gpus)
    assert ns.enable_dp_attention is (gpus > 1)
    assert ns.ep_size == gpus
    assert ns.speculative_algorithm == ("DSPARK" if spec else None)
    assert ns.load_format == "dummy"


def server_args_for(gpus: int):
    from sglang.srt.server_args import ServerArgs

    multi = (
        dict(
            tp_size=gpus,
            dp_size=gpus,
            ep_size=gpus,
            enable_dp_attention=True,
            enable_dp_lm_head=True,
        )
        if gpus > 1
        else {}
    )
    return ServerArgs(
        model_path=str(TARGET),
        device="cuda",  # no accelerator on CPU; skip get_device()
        load_format="dummy",
        speculative_algorithm="DSPARK",
        speculative_draft_model_path=str(DRAFT),
        cuda_graph_max_bs_decode=8,
        context_length=4096,
        **multi,
    )


@pytest.mark.parametrize("gpus", GPUS)
def test_server_args_post_init(gpus):
    sa = server_args_for(gpus)
    assert (sa.tp_size, sa.dp_size) == (gpus, gpus)
    assert sa.speculative_algorithm == "DSPARK"
    if sa.speculative_num_draft_tokens is None:
        pytest.skip(
            "this release resolves the draft tokens and the attention backend "
            "at launch, not in ServerArgs"
        )
    assert sa.speculative_num_draft_tokens == 5
    assert sa.attention_backend == "dsv4"
