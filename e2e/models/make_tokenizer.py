"""Build the tiny byte-level BPE tokenizer of the e2e target model.

Trained in-process on the first GSM8K training rows, so nothing is downloaded.
The vocabulary is padded to exactly the model's ``vocab_size`` and the DSpark
mask token takes the last id (``dspark_config.mask_token_id`` of the draft).

    python e2e/models/make_tokenizer.py [--data PATH] [--rows N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "tiny-dsv4-target"
#: GSM8K's train split beside the checkout (``../shared/data/gsm8k``).
GSM8K_TRAIN = HERE.parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
DRAFT = HERE / "tiny-dsv4-dspark-draft"
SPECIAL = ["<bos>", "<eos>", "<pad>"]
MASK = "<|mask|>"


def build(data: Path, rows: int, out: Path = TARGET) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    config = json.loads((TARGET / "config.json").read_text())
    vocab_size = int(config["vocab_size"])
    mask_id = int(
        json.loads((DRAFT / "config.json").read_text())["dspark_config"][
            "mask_token_id"
        ]
    )
    if mask_id != vocab_size - 1:
        raise SystemExit(f"mask_token_id {mask_id} must be vocab_size - 1")

    lines = []
    with data.open() as f:
        for i, line in enumerate(f):
            if i >= rows:
                break
            row = json.loads(line)
            lines += [row["question"], row["answer"]]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    filler = [f"<|reserved_{i}|>" for i in range(vocab_size - 1 - tok.get_vocab_size())]
    if filler:
        tok.add_special_tokens(filler)
    tok.add_special_tokens([MASK])
    if tok.token_to_id(MASK) != mask_id or tok.get_vocab_size() != vocab_size:
        raise SystemExit(
            f"tokenizer layout wrong: size {tok.get_vocab_size()}, "
            f"mask id {tok.token_to_id(MASK)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL[0],
        "eos_token": SPECIAL[1],
        "pad_token": SPECIAL[2],
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": int(config["max_position_embeddings"]),
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2) + "\n"
    )
    return tok.get_vocab_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=GSM8K_TRAIN)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args()
    print(f"wrote {args.out} (vocab {build(args.data, args.rows, args.out)})")


if __name__ == "__main__":
    main()
