#!/usr/bin/env python3
"""Writes tests/data/tokenizers/: two byte-level BPE tokenizers trained here with pip's `tokenizers` (the kinds GPT-2
and Llama-3 use) and the ids `tokenizers` gives for a corpus of test texts, the oracle tests/test_tokenizer.cpp holds
nn::Tokenizer to:
  - gpt2_style/tokenizer.json: the ByteLevel pre-tokenizer with GPT-2's own regex (use_regex), no prefix space;
  - llama3_style/tokenizer.json: a Split on Llama-3's regex (Isolated) then ByteLevel without its regex;
  - cases.json: {"gpt2_style": [[text, ids], ...], "llama3_style": [...]}, special tokens included in some texts.
Run with Debian's python3 (scripts/install_deps.sh installs tokenizers for it):
    /usr/bin/python3 tests/golden/make_tokenizer_golden.py
"""
import json
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

root = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizers"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
TRAINING = [
    "The quick brown fox jumps over the lazy dog. The dog's owner didn't mind; they'll walk later.",
    "Naïve café owners serve crème brûlée — deliciously! Straße, façade, coöperate.",
    "日本語のテキストも少し。中文也有一点。한국어 문장도 있습니다.",
    "Numbers: 3.14159, 2.71828, 1,000,000 and 42nd; dates 2026-12-05.",
    "def add(a, b):\n    return a + b  # code is text too\n\n\tindented\twith tabs   and   runs of spaces",
    "Emoji 🙂🚀 and symbols ∑∫≠ ← → «quotes» “curly” ‘single’.",
]
CASES = [
    "Hello world",
    " leading space and trailing space ",
    "The dog's owner didn't mind; they'll walk, I'm sure, you've seen, we'd go.",
    "THE DOG'S OWNER DIDN'T: upper-case contractions",
    "café crème brûlée Straße",
    "日本語のテキスト 中文 한국어",
    "12345678901 3.14159 1,000,000",
    "def f(x):\n    return x * 2\n\n\n\tend  \n",
    "   many    spaces\t\ttabs\r\nwindows line\rcarriage",
    "🙂🚀∑ unseen: ✓ ⚡ 🦙",
    "text<|end|>more text <|end|> and<|end|><|end|>",
    "<|pad|>padding first, then <|end|>",
    "",
    "a",
    " ",
    "\n\n",
    "x" * 200,
    " " * 20000 + "end",  # one long piece of merged spaces: the merge rounds must not be quadratic in its length
]


def train(pre_tokenizer):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|end|>", "<|pad|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TRAINING * 30, trainer=trainer)
    return tokenizer


tokenizers = {
    "gpt2_style": train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
    "llama3_style": train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
}
cases = {}
for name, tokenizer in tokenizers.items():
    (root / name).mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / name / "tokenizer.json"))
    cases[name] = []
    for text in CASES + TRAINING:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text, (name, text)
        cases[name].append([text, ids])
(root / "cases.json").write_text(json.dumps(cases, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
print(f"wrote {root}: {', '.join(f'{n} ({t.get_vocab_size()} ids)' for n, t in tokenizers.items())}, "
      f"{len(CASES) + len(TRAINING)} cases each")
