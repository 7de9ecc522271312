"""Build the tiny word-level tokenizer and the small datasets shipped for trainfit's tests.

    python examples/dataset/make_tokenizer.py     # rewrites the files beside this script

The tokenizer splits on whitespace and punctuation (`tokenizers` Whitespace pre-tokenizer: runs
of word characters, or runs of other non-space characters), maps each piece to an id from a
small vocabulary (unknown pieces -> [UNK]), and its post-processor puts <s> in front of every
encoded text (as Llama's does). So a text's token count is 1 + its pieces, which the tests check
by hand. tokenizer_config.json beside it gives the EOS token and a ChatML-style chat template
written for these tests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

HERE = Path(__file__).resolve().parent
SPECIALS = ["[UNK]", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = str.split(
    "the a an of to in on for with is are was be this that it you we they how what why when "
    "train model memory gpu card token tokens sequence length batch long short fits fit does "
    "not yes no please explain answer question user assistant system hello world data set "
    "run step loss adam lora rank layer head attention hidden size cost time hour price"
)
PUNCT = [".", ",", "?", "!", ":", "'", "-"]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS + PUNCT)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tok.add_special_tokens(SPECIALS)
    return tok


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice([" .", " ?", " !"])


def main() -> None:
    build_tokenizer().save(str(HERE / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "[UNK]",
        "chat_template": TEMPLATE,
    }
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    rng = random.Random(14)
    with (HERE / "texts.jsonl").open("w") as f:
        for i in range(60):
            n = rng.choice([3, 8, 20, 40, 90, 200]) if i % 7 else 500
            f.write(json.dumps({"id": i, "text": sentence(rng, n)}) + "\n")
    with (HERE / "chats.jsonl").open("w") as f:
        for i in range(40):
            turns = [{"role": "system", "content": "you are a gpu memory assistant ."}] * (i % 2)
            for _ in range(1 + i % 3):
                turns.append({"role": "user", "content": sentence(rng, rng.randint(3, 30))})
                turns.append({"role": "assistant", "content": sentence(rng, rng.randint(5, 120))})
            f.write(json.dumps({"id": i, "messages": turns}) + "\n")


if __name__ == "__main__":
    main()
