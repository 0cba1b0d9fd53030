"""What the train_gpt round-trip scripts (hf_roundtrip, hf_llama_roundtrip, peft_roundtrip) share: their
arguments, a fresh work directory and the llm.c token shard they train on."""
import pathlib
import random
import shutil
import struct
import sys


def prepare(seed):
    """Reads TRAIN_GPT DATA_DIR WORK_DIR from the command line, empties WORK_DIR and writes WORK_DIR/train.bin:
    an llm.c shard (magic, version, count, then uint16 ids) of 4096 ids below 64, the test checkpoints'
    vocabulary. Returns (train_gpt, data_dir, work, tokens)."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} TRAIN_GPT DATA_DIR WORK_DIR")
    train_gpt, data_dir, work = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    generator = random.Random(seed)
    tokens = [generator.randrange(64) for _ in range(4096)]
    with open(work / "train.bin", "wb") as file:
        file.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
        file.write(struct.pack(f"<{len(tokens)}H", *tokens))
    return train_gpt, data_dir, work, tokens
