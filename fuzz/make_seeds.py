#!/usr/bin/env python3
"""Writes the small valid seed inputs under fuzz/corpus/<target>/ from the format descriptions alone
(docs/RELIABILITY.md for state files, the safetensors and llm.c layouts), independently of the C++ writers.
Regression inputs from fuzzing sit next to them (named regression-*) and are not touched."""
import json
import pathlib
import struct
import zlib

root = pathlib.Path(__file__).resolve().parent / "corpus"


def state_file(metadata, tensors):
    """tensors: list of (name, dtype code 1=f32 2=f64 3=i32, shape, data bytes)."""
    meta = json.dumps(metadata, separators=(",", ":")).encode()
    body = bytearray(meta)
    for name, code, shape, data in tensors:
        body += struct.pack("<IIII", len(name), code, len(shape), 0) + name.encode()
        body += b"".join(struct.pack("<q", extent) for extent in shape)
        body += struct.pack("<Q", len(data)) + data
    file_bytes = 40 + len(body) + 4
    head = b"LIBENGST" + struct.pack("<IIQQQ", 1, 0, file_bytes, len(meta), len(tensors))
    content = head + bytes(body)
    return content + struct.pack("<I", zlib.crc32(content))


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, data bytes)."""
    header, data, offset = {}, bytearray(), 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)


def token_shard(tokens):
    header = struct.pack("<iii", 20240520, 1, len(tokens)) + bytes(1024 - 12)
    return header + b"".join(struct.pack("<H", token) for token in tokens)


def wide_token_shard(tokens):
    """llm.c's Llama-3 layout: magic 20240801, version 7, uint32 ids."""
    header = struct.pack("<iii", 20240801, 7, len(tokens)) + bytes(1024 - 12)
    return header + b"".join(struct.pack("<I", token) for token in tokens)


def write(target, name, content):
    directory = root / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(content)


f32 = lambda values: struct.pack(f"<{len(values)}f", *values)
write("state_file", "seed-two-tensors", state_file(
    {"step": 3, "config": {"model": "tiny"}},
    [("w", 1, [2, 2], f32([1.0, -2.0, 0.5, 0.0])), ("cursor", 3, [], struct.pack("<i", 7)),
     ("m", 2, [1], struct.pack("<d", 0.25))]))
write("state_file", "seed-empty", state_file({}, []))
write("safetensors", "seed-f32", safetensors(
    [("wte.weight", "F32", [2, 3], f32([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])), ("ln_f.bias", "F32", [3], f32([0, 1, 2]))],
    {"format": "pt"}))
write("safetensors", "seed-bf16-f64", safetensors(
    [("a", "BF16", [2], struct.pack("<HH", 0x3F80, 0xC000)), ("b", "F64", [], struct.pack("<d", 1.5))]))
write("token_shard", "seed-shard", token_shard([50256, 15496, 11, 995, 0]))
write("token_shard", "seed-empty-shard", token_shard([]))
write("token_shard", "seed-wide-shard", wide_token_shard([128000, 65536, 11, 0, 50256]))
write("token_shard", "seed-bytes", b"the cat sees the dog.\n")
