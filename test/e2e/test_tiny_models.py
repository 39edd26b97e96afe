"""CPU validation of the tiny DeepSeek-V4 target / DSpark draft configs.

Uses SGLang's own config loading and DSpark config parsing; skipped when
SGLang (0.5.16 or newer with DSpark) is not importable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sglang")
hf_utils = pytest.importorskip("sglang.srt.utils.hf_transformers_utils")
model_config = pytest.importorskip("sglang.srt.configs.model_config")
dspark_config = pytest.importorskip(
    "sglang.srt.speculative.dspark_components.dspark_config"
)

MODELS = Path(__file__).resolve().parents[2] / "e2e" / "models"
TARGET = MODELS / "tiny-dsv4-target"
DRAFT = MODELS / "tiny-dsv4-dspark-draft"
GPUS = (2, 4)


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
        assert c.num_attention_heads * c.head_dim % c.o_groups == 0
    assert c.num_attention_heads <= 64  # padded to 64 heads in FlashMLA decode
    assert c.hc_mult == 4


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


@pytest.mark.parametrize("gpus", GPUS)
def test_launch_flags_parse(gpus):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(
        [
            "--model-path", str(TARGET), "--load-format", "dummy",
            "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", str(DRAFT),
            "--tp-size", str(gpus), "--dp-size", str(gpus),
            "--enable-dp-attention", "--enable-dp-lm-head",
            "--ep-size", str(gpus), "--cuda-graph-max-bs-decode", "128",
            "--port", "31000", "--host", "127.0.0.1",
            "--mem-fraction-static", "0.5", "--context-length", "4096",
        ]
    )  # fmt: skip
    assert (ns.tp_size, ns.dp_size, ns.ep_size) == (gpus, gpus, gpus)


@pytest.mark.parametrize("gpus", GPUS)
def test_server_args_post_init(gpus):
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(
        model_path=str(TARGET),
        device="cuda",  # no accelerator on CPU; skip get_device()
        load_format="dummy",
        tp_size=gpus,
        dp_size=gpus,
        ep_size=gpus,
        enable_dp_attention=True,
        enable_dp_lm_head=True,
        speculative_algorithm="DSPARK",
        speculative_draft_model_path=str(DRAFT),
        cuda_graph_max_bs_decode=128,
        context_length=4096,
    )
    from importlib.metadata import version

    if not version("sglang").startswith("0.5.16"):
        # The e2e run targets 0.5.16; later releases resolve these lazily.
        return
    assert sa.speculative_num_draft_tokens == 5
    assert sa.attention_backend == "dsv4"
