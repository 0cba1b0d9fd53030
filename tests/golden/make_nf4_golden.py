#!/usr/bin/env python3
"""Writes tests/data/nf4_golden.safetensors: a weight quantised to NF4 as bitsandbytes' QLoRA path does it
(quantize_4bit with quant_type nf4, blocksize 64, compress_statistics: the double quantisation of the absmax
scales), the oracle tests/test_nf4.cpp compares kernels/cpu/nf4.cpp against bit for bit.

bitsandbytes 0.41.3 runs on Debian's torch 1.13, but its CPU library has only the 8-bit blockwise quantiser and
the code tables; the 4-bit quantiser is a CUDA kernel. So:
  - the NF4 code table, the dynamic 8-bit map (create_dynamic_map) and the double quantisation of the scales
    (quantize_blockwise, blocksize 256, on the CPU) are bitsandbytes' own functions;
  - the 4-bit step is its CUDA kernel's rule written in torch: scale = 1 / absmax (f32), x · scale (f32), the
    code the number of the kernel's 15 decision thresholds (dQuantizeNF4's constants) that it exceeds, packed
    two a byte, the first element in the high nibble;
  - the scales' offset is their f32 mean, which bitsandbytes takes with torch (absmax.mean()).
Dequantisation is bitsandbytes': absmax = map[code] · absmax2 (dequantize_blockwise, on the CPU) + offset, then
NF4[nibble] · absmax, each product and sum rounded to f32 (bf16: rounded once more, to nearest even). The map is
the CPU quantiser's: create_dynamic_map's with its first entry overwritten by -1.0 (the quantiser does so to bound
its binary search, and dequantises with the same map); bitsandbytes' GPU kernels keep -0.99297 there.

Run with Debian's python3 and bitsandbytes 0.41.3 importable from BITSANDBYTES_PATH (not installed into that
python, whose PEFT would import it):
    pip download bitsandbytes==0.41.3 --no-deps -d /tmp/bnb && unzip -q -d /tmp/bnbx /tmp/bnb/*.whl
    BITSANDBYTES_PATH=/tmp/bnbx /usr/bin/python3 tests/golden/make_nf4_golden.py
"""
import os
import pathlib
import sys
import warnings

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.environ["BITSANDBYTES_PATH"])
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import bitsandbytes.functional as bnb

root = pathlib.Path(__file__).resolve().parents[1] / "data"

# dQuantizeNF4's decision thresholds (csrc/kernels.cu), ascending: the midpoints of adjacent NF4 values.
THRESHOLDS = torch.tensor([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                           -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                           0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                           0.5016634166240692, 0.6427869200706482, 0.8614784181118011], dtype=torch.float32)


def weight():
    """38437 values (600 whole blocks of 64 and a last one of 37; 601 scales, so three scale blocks, the last
    partial): normal blocks at scales over six decades, a zero block, blocks whose absmax is negative, a block of
    one large value, and values placed on the thresholds times their block's absmax."""
    generator = torch.Generator().manual_seed(2024)
    blocks = []
    for index in range(601):
        count = 64 if index < 600 else 37
        scale = 10.0 ** (-4 + 6 * torch.rand(1, generator=generator).item())
        block = torch.randn(count, generator=generator) * scale
        if index == 5:
            block = torch.zeros(count)
        elif index % 7 == 3:
            block[count // 2] = -block.abs().max() * 1.5  # the absmax from a negative value
        elif index == 11:
            block = torch.zeros(count)
            block[13] = 3.0e4
        elif index % 13 == 0:
            absmax = block.abs().max()
            block[1:16] = THRESHOLDS * absmax
            block[16:31] = torch.nextafter(THRESHOLDS * absmax, torch.full((15,), float("inf")))
        blocks.append(block.float())
    return torch.cat(blocks)


def quantize_nf4(values):
    blocks = torch.nn.functional.pad(values, (0, (-values.numel()) % 64)).view(-1, 64)
    absmax = blocks.abs().max(dim=1).values
    scale = (torch.ones_like(absmax) / absmax).unsqueeze(1)  # IEEE division in f32, as 1.0f / absmax
    normalized = blocks * scale
    codes = (normalized.unsqueeze(2) > THRESHOLDS).sum(dim=2).to(torch.uint8).flatten()[: values.numel()]
    codes = torch.nn.functional.pad(codes, (0, codes.numel() % 2))
    return (codes[0::2] << 4) | codes[1::2], absmax


def main():
    values = weight()
    packed, absmax = quantize_nf4(values)
    offset = absmax.mean()
    centred = absmax - offset
    code = bnb.create_dynamic_map(signed=True)  # the CPU quantiser writes its first entry
    scale_codes, state = bnb.quantize_blockwise(centred, code=code, blocksize=256)
    scale_absmax = state.absmax
    assert code[0].item() == -1.0 and state.code is code
    restored = bnb.dequantize_blockwise(scale_codes, state) + offset
    nf4 = bnb.get_4bit_type("nf4", device="cpu")
    nibbles = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[: values.numel()].long()
    dequantized = nf4[nibbles] * restored.repeat_interleave(64)[: values.numel()]
    save_file({
        "input": values,
        "nf4_code": nf4.float(),
        "thresholds": THRESHOLDS,
        "dynamic_map": code.float(),
        "codes": packed.contiguous(),
        "absmax": absmax.contiguous(),
        "offset": offset.reshape(1),
        "scale_codes": scale_codes.contiguous(),
        "scale_absmax": scale_absmax.float().contiguous(),
        "absmax_dequantized": restored.contiguous(),
        "dequantized": dequantized.contiguous(),
        "dequantized_bf16": dequantized.to(torch.bfloat16).contiguous(),
    }, str(root / "nf4_golden.safetensors"), metadata={"generator": "tests/golden/make_nf4_golden.py",
                                                      "bitsandbytes": "0.41.3"})
    print(f"{values.numel()} values, {absmax.numel()} scales, {scale_absmax.numel()} second-level scales; "
          f"offset {offset.item():.9g}; largest error {float((dequantized - values).abs().max()):.3g}")


main()
