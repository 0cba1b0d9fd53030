#!/usr/bin/env python3
"""ctest prepare_data: scripts/prepare_data.py against `tokenizers` itself. A byte-level BPE tokenizer (the kind
GPT-2 and Llama-3 use) is trained here, offline, on a small corpus with non-ASCII text, and saved in a model
directory with a config.json and a chat template. prepare_data.py turns a text file and a JSONL file (text lines, a
chat, a blank line) into a training shard and a validation shard; every document's ids must equal
tokenizers' own encoding of it followed by the end of text, decode back to the same text, and land on the side
the --validation-fraction rule says; the chat must be the template rendered by hand. A vocabulary past 65536
gives uint32 ids (llm.c's Llama-3 layout). Bad inputs (not UTF-8, a JSONL line without its field, a tokenizer
larger than the model's vocabulary, a missing tokenizer.json) are one line, exit 2, and leave the outputs as they
were. Finally train_gpt trains on the shards, with the validation shard as --eval-data.

usage: prepare_data_roundtrip.py TRAIN_GPT SOURCE_DIR WORK_DIR
Exits 77 (ctest: skipped) when tokenizers or transformers is not importable; test.sh counts a skip as a failure.
"""
import json
import pathlib
import shutil
import struct
import subprocess
import sys

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers  # noqa: F401  (prepare_data renders chat templates with it)
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

train_gpt, source, work = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
prepare = source / "scripts" / "prepare_data.py"
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
failures = []


def check(condition, message):
    print(("ok: " if condition else "FAIL: ") + message)
    if not condition:
        failures.append(message)


CORPUS = [
    "The cat sat on the mat. The dog sat on the log.",
    "Naïve café owners serve crème brûlée — deliciously! 日本語のテキストも少し。",
    "Numbers: 3.14159, 2.71828 and 1,000,000.\nA second line\twith a tab.",
    "def add(a, b):\n    return a + b  # code is text too",
]


def make_model(directory, vocab_size, tokenizer_vocab=300):
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=tokenizer_vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    end_of_text = tokenizer.token_to_id("<|endoftext|>")
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size,
                                                       "eos_token_id": end_of_text}))
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template,
                                                                 "eos_token": "<|endoftext|>"}))
    return tokenizer, end_of_text


def read_shard(path):
    data = path.read_bytes()
    magic, version, count = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): "H", (20240801, 7): "I"}[(magic, version)]
    ids = list(struct.unpack(f"<{count}{width}", data[1024:]))
    assert len(data) == 1024 + struct.calcsize(width) * count
    return ids, width


def run(*arguments):
    completed = subprocess.run([sys.executable, str(prepare), *arguments], capture_output=True, text=True)
    return completed.returncode, completed.stdout, completed.stderr


model = work / "model"
tokenizer, end_of_text = make_model(model, 320)
(work / "a.txt").write_text(CORPUS[1] + "\n" + CORPUS[2], encoding="utf-8")
chat = [{"role": "user", "content": "Hi — café?"}, {"role": "assistant", "content": "Oui, café."}]
# The last line holds a raw U+2028 inside its string, as json.dumps(ensure_ascii=False) writes it: one line of JSON.
lines = [json.dumps({"text": CORPUS[0]}), json.dumps({"text": CORPUS[3]}), "",
         json.dumps({"messages": chat}), json.dumps({"text": "short\u2028line"}, ensure_ascii=False)]
(work / "b.jsonl").write_text("\r\n".join(lines) + "\n", encoding="utf-8")
documents = [CORPUS[1] + "\n" + CORPUS[2], CORPUS[0], CORPUS[3], "<|user|>Hi — café?\n<|assistant|>Oui, café.\n",
             "short\u2028line"]
code, out, err = run("--model", str(model), "--output", str(work / "train.bin"), "--validation",
                     str(work / "valid.bin"), "--validation-fraction", "0.25", str(work / "a.txt"), str(work / "b.jsonl"))
print(out, err[-400:])
check(code == 0, f"prepare_data ran (exit {code})")
# Document i is held out when floor((i+1)·0.25) > floor(i·0.25): of five, the fourth (the chat).
held_out = [int((i + 1) * 0.25) > int(i * 0.25) for i in range(len(documents))]
expected_train, expected_valid = [], []
for document, held in zip(documents, held_out):
    ids = tokenizer.encode(document, add_special_tokens=False).ids
    check(tokenizer.decode(ids) == document, f"tokenizers decodes its ids back to {document[:24]!r}")
    (expected_valid if held else expected_train).extend(ids + [end_of_text])
train_ids, width = read_shard(work / "train.bin")
valid_ids, _ = read_shard(work / "valid.bin")
check(width == "H", "a vocabulary of 320 gives uint16 ids")
check(train_ids == expected_train, f"the training shard is tokenizers' ids with the end of text after each document "
                                   f"({len(train_ids)} ids)")
check(valid_ids == expected_valid, f"the validation shard holds the chat, rendered by its template ({len(valid_ids)} ids)")
check(max(train_ids + valid_ids) < 320 and train_ids.count(end_of_text) == 4, "four training documents, ids in range")

# A vocabulary past 65536: uint32 ids, the same values.
wide_model = work / "wide_model"
shutil.copytree(model, wide_model)
config = json.loads((wide_model / "config.json").read_text())
config["vocab_size"] = 70000
(wide_model / "config.json").write_text(json.dumps(config))
code, _, err = run("--model", str(wide_model), "--output", str(work / "wide.bin"), str(work / "a.txt"), str(work / "b.jsonl"))
wide_ids, wide_width = read_shard(work / "wide.bin")
check(code == 0 and wide_width == "I" and wide_ids == [i for d in documents
                                                         for i in tokenizer.encode(d, add_special_tokens=False).ids + [end_of_text]],
      "a vocabulary of 70000 gives uint32 ids (magic 20240801), the same ids")

# Bad inputs: one line, exit 2, outputs untouched.
(work / "kept.bin").write_bytes(b"kept")
(work / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
(work / "no_field.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
small = work / "small_model"
shutil.copytree(model, small)
config = json.loads((small / "config.json").read_text())
config["vocab_size"] = 100
(small / "config.json").write_text(json.dumps(config))
no_tokenizer = work / "no_tokenizer"
no_tokenizer.mkdir()
shutil.copy(model / "config.json", no_tokenizer)
for arguments, expected in [
        (["--model", str(model), str(work / "latin1.txt")], "not UTF-8: byte 0xe9 at offset 3 (line 1)"),
        (["--model", str(model), str(work / "no_field.jsonl")], "no_field.jsonl:2: no \"text\" string or \"messages\""),
        (["--model", str(small), str(work / "a.txt")], "the tokenizer has 300 ids but config.json's vocab_size is 100"),
        (["--model", str(no_tokenizer), str(work / "a.txt")], "no tokenizer.json"),
        (["--model", str(model), "--validation-fraction", "0.5", str(work / "a.txt")], "go together"),
        (["--model", str(model), "--validation", str(work / "v.bin"), "--validation-fraction", "0.25", str(work / "a.txt")],
         "no document went to --validation (1 documents at a fraction of 0.25)"),
        # The training shard is staged, then the validation one cannot be: neither lands, no temporary stays.
        (["--model", str(model), "--validation", "/proc/valid.bin", "--validation-fraction", "0.25",
          str(work / "a.txt"), str(work / "b.jsonl")], "/proc/valid.bin: cannot write there"),
        (["--model", str(model), "--bogus", str(work / "a.txt")], "unrecognized arguments: --bogus")]:
    code, out, err = run("--output", str(work / "kept.bin"), *arguments)
    check(code == 2 and len(err.strip().splitlines()) == 1 and expected in err and out == ""
          and (work / "kept.bin").read_bytes() == b"kept",
          f"refused in one line with exit 2, output untouched: {err.strip()}")
check(not any(p.name.startswith(".kept.bin.") for p in work.iterdir()), "no temporary file left behind")

# train_gpt trains on what it wrote, the validation shard as --eval-data.
completed = subprocess.run([train_gpt, "--model", "llama-tiny", "--vocab-size", "320", "--data", str(work / "train.bin"),
                            "--eval-data", str(work / "valid.bin"), "--eval-steps", "1", "--seq-len", "16",
                            "--per-device-train-batch-size", "2", "--max-steps", "2", "--device", "cpu"],
                           capture_output=True, text=True)
print(completed.stdout[-600:], completed.stderr[-600:])
check(completed.returncode == 0, "train_gpt trains on the shards prepare_data wrote")

if failures:
    sys.exit(f"{len(failures)} prepare_data checks failed")
print("prepare_data round trips ok")
