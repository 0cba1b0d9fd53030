#!/usr/bin/python3
"""Text in: turns text files and JSONL into the token shards train_gpt reads (docs/FORMATS.md), with the model
directory's own tokenizer (its tokenizer.json, through pip's `tokenizers`, offline).

usage: prepare_data.py --model DIR --output FILE [--validation FILE --validation-fraction F] INPUT...

Each INPUT is a document source:
  - a text file (any name but *.jsonl): the whole file is one document;
  - a JSONL file (*.jsonl): one document a line, its "text" field, or its "messages" (a chat: a list of
    {"role", "content"}) rendered through the directory's chat template (tokenizer_config.json's chat_template,
    as transformers' apply_chat_template renders it).
The directory's end-of-text token (config.json's eos_token_id) follows every document, so train_gpt's
`--data-layout padded` splits them again. The ids go out as uint16 when the model's vocabulary is at most 65536,
else as uint32 (llm.c's Llama-3 layout). With --validation, a share F of the documents (spread evenly: document i
goes there when floor((i+1)·F) > floor(i·F)) goes to that file instead, for train_gpt's --eval-data.

Everything is read, checked and tokenised before anything is written, and each output is written to a temporary
file and renamed: a bad input (a file that is not UTF-8, a JSONL line that is not JSON or lacks the field, a
tokenizer whose ids do not fit the model's vocabulary) is one line on stderr, exit 2, and no output file.

Run it with the python that scripts/install_deps.sh equips (Debian's /usr/bin/python3 with tokenizers).
"""
import argparse
import json
import os
import pathlib
import struct
import sys
import tempfile


class InputError(Exception):
    """A bad input: printed as one line, exit 2."""


def fail(message):
    raise InputError(message)


def read_json(path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        fail(f"{path}: {error}")


class ModelTokenizer:
    """The directory's tokenizer.json, its end of text, its vocabulary and (when it has one) its chat template."""

    def __init__(self, directory):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail("the python package 'tokenizers' is missing: run scripts/install_deps.sh, then this script with "
                 "/usr/bin/python3")
        directory = pathlib.Path(directory)
        if not directory.is_dir():
            fail(f"--model {directory}: not a directory")
        for name in ("tokenizer.json", "config.json"):
            if not (directory / name).is_file():
                fail(f"--model {directory}: no {name} (a Hugging Face model directory holds both)")
        self.directory = directory
        try:
            self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # tokenizers raises its own exception types
            fail(f"{directory / 'tokenizer.json'}: not a tokenizer the tokenizers package reads: {error}")
        config = read_json(directory / "config.json")
        self.vocab_size = config.get("vocab_size")
        if not isinstance(self.vocab_size, int) or self.vocab_size <= 0:
            fail(f"{directory / 'config.json'}: no positive integer vocab_size")
        tokenizer_ids = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if tokenizer_ids > self.vocab_size:
            fail(f"--model {directory}: the tokenizer has {tokenizer_ids} ids but config.json's vocab_size is "
                 f"{self.vocab_size}: its ids would not fit the model")
        eos = config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if not isinstance(eos, int) or not 0 <= eos < self.vocab_size:
            fail(f"{directory / 'config.json'}: eos_token_id {eos!r} is not an id of the vocabulary of "
                 f"{self.vocab_size}: no end-of-text token to put between documents")
        self.end_of_text = eos
        tokenizer_config_path = directory / "tokenizer_config.json"
        self.tokenizer_config = read_json(tokenizer_config_path) if tokenizer_config_path.is_file() else {}
        self.chat_template = self.tokenizer_config.get("chat_template")

    def encode(self, text):
        # No special tokens added: a document is its text's ids; the chat template writes its own markers.
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def render_chat(self, messages, where):
        if not self.chat_template:
            fail(f"{where}: a chat (\"messages\") but {self.directory} has no chat_template in tokenizer_config.json")
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError:
            fail("the python package 'transformers' is missing (it renders chat templates): run scripts/install_deps.sh")
        if not hasattr(self, "chat_renderer"):
            special = {key: self.tokenizer_config[key] for key in ("bos_token", "eos_token", "unk_token", "pad_token")
                       if isinstance(self.tokenizer_config.get(key), str)}
            self.chat_renderer = PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, **special)
        try:
            return self.chat_renderer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False)
        except Exception as error:  # jinja2's errors, and the template's own raise_exception
            fail(f"{where}: the chat template cannot render these messages: {error}")


def documents_of(path, tokenizer):
    """Yields (where, text) for every document of one input, checked: UTF-8, JSON, the field present."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        fail(f"{path}: {error.strerror}")
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        fail(f"{path}: not UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start} (line {line})")
    if path.suffix != ".jsonl":
        yield str(path), content
        return
    # Lines end at "\n" only: str.splitlines would also split at U+2028, U+2029 and U+0085, which JSON strings may hold.
    for number, line in enumerate(content.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            fail(f"{where}: not JSON: {error.msg} at column {error.colno}")
        if not isinstance(record, dict):
            fail(f"{where}: a JSON {type(record).__name__}, not an object with a \"text\" or \"messages\" field")
        if isinstance(record.get("text"), str):
            yield where, record["text"]
        elif isinstance(record.get("messages"), list):
            yield where, tokenizer.render_chat(record["messages"], where)
        else:
            fail(f"{where}: no \"text\" string or \"messages\" list (the keys are {sorted(record)})")


def progress(total):
    """A progress bar over the documents, on stderr; a plain count where tqdm is missing."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, unit="doc", file=sys.stderr, disable=None)
    except ImportError:
        class Plain:
            def update(self, count):
                pass

            def close(self):
                print(f"prepare_data: {total} documents", file=sys.stderr)
        return Plain()


def stage_shard(path, ids, vocab_size):
    """llm.c's shard: uint16 ids (magic 20240520, version 1) or uint32 ones (20240801, version 7), written and synced
    to a temporary file beside `path`, whose name it returns; commit() renames it into place."""
    wide = vocab_size > 65536
    header = struct.pack("<256i", *([20240801 if wide else 20240520, 7 if wide else 1, len(ids)] + [0] * 253))
    path = pathlib.Path(path)
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.absolute().parent)
    except OSError as error:
        fail(f"{path}: cannot write there: {error.strerror}")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(header)
            file.write(struct.pack(f"<{len(ids)}{'I' if wide else 'H'}", *ids))
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        os.unlink(temporary)
        fail(f"{path}: cannot write it: {error.strerror}")
    return temporary


def commit(staged):
    """Every staged shard renamed into place, once all of them were written: a failure before leaves every output
    as it was."""
    for temporary, path in staged:
        os.replace(temporary, path)


def main(arguments):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.error = fail  # argparse's own complaints are one line and exit 2 too
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (tokenizer.json, config.json)")
    parser.add_argument("--output", required=True, help="the training shard to write")
    parser.add_argument("--validation", help="a second shard for a share of the documents (train_gpt --eval-data)")
    parser.add_argument("--validation-fraction", type=float, default=None,
                        help="the share of documents that go to --validation (0 < F < 1)")
    parser.add_argument("inputs", nargs="+", help="text files (one document each) and JSONL files (one a line)")
    options = parser.parse_args(arguments)
    if (options.validation is None) != (options.validation_fraction is None):
        fail("--validation and --validation-fraction go together")
    if options.validation_fraction is not None and not 0.0 < options.validation_fraction < 1.0:
        fail(f"--validation-fraction {options.validation_fraction} must be between 0 and 1")
    outputs = [pathlib.Path(options.output)] + ([pathlib.Path(options.validation)] if options.validation else [])
    for output in outputs:
        if output.is_dir() or not output.absolute().parent.is_dir():
            fail(f"{output}: cannot be written (a directory, or its folder does not exist)")
    tokenizer = ModelTokenizer(options.model)

    documents = []
    for name in options.inputs:
        documents.extend(documents_of(pathlib.Path(name), tokenizer))
    if not documents:
        fail("the inputs hold no document")
    fraction = options.validation_fraction or 0.0
    train_ids, validation_ids = [], []
    bar = progress(len(documents))
    for index, (where, text) in enumerate(documents):
        ids = tokenizer.encode(text) + [tokenizer.end_of_text]
        held_out = int((index + 1) * fraction) > int(index * fraction)
        (validation_ids if held_out else train_ids).extend(ids)
        bar.update(1)
    bar.close()
    if not train_ids:
        fail("every document went to --validation: lower --validation-fraction")
    if options.validation and not validation_ids:
        fail(f"no document went to --validation ({len(documents)} documents at a fraction of {fraction}): raise "
             "--validation-fraction or give more documents")
    staged = [(stage_shard(options.output, train_ids, tokenizer.vocab_size), options.output)]
    try:
        if options.validation:
            staged.append((stage_shard(options.validation, validation_ids, tokenizer.vocab_size), options.validation))
    except InputError:
        for temporary, _ in staged:
            os.unlink(temporary)
        raise
    commit(staged)
    width = "uint32" if tokenizer.vocab_size > 65536 else "uint16"
    held = sum(1 for index in range(len(documents)) if int((index + 1) * fraction) > int(index * fraction))
    print(f"prepare_data: {len(documents) - held} documents, {len(train_ids)} tokens ({width} ids, end of text "
          f"{tokenizer.end_of_text}) -> {options.output}" +
          (f"; {held} documents, {len(validation_ids)} tokens -> {options.validation}" if options.validation else ""))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as error:
        print(f"prepare_data: error: {error}", file=sys.stderr)
        sys.exit(2)
