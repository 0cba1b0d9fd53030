#!/usr/bin/env python3
"""The house rules of the tree, checked (docs/ARCHITECTURE.md, "Layers"):

1. Layering: each room includes only its own headers and the rooms below it,
   base <- kernels <- engine <- checkpoint <- nn <- planner <- optim <- bench, with the emulator beside
   libcudart (it and base/cuda reach only each other). The rooms above engine reach the kernels only through
   the engine's ops: they include nothing from kernels/ and not engine/dispatch.h.
2. The CUDA backend is asked about in one place: `#if ENGINE_HAS_CUDA` appears only in the device layer
   (engine/cuda/) and base/cuda/.
3. Twins: every kernels/cuda/<name>.cu has its CPU twin kernels/cpu/<name>.cpp (helpers that only a GPU
   needs are headers, .cuh or .h).

usage: check_tree.py ROOT        exit 1 and one line per broken rule
       check_tree.py --self-test  builds trees that break each rule and checks that each is refused
"""
import os
import re
import sys
import tempfile

# Each library room and the rooms it may include, itself among them.
ORDER = ["base", "kernels", "engine", "checkpoint", "nn", "planner", "optim", "bench"]
ALLOWED = {room: set(ORDER[: index + 1]) for index, room in enumerate(ORDER)}
ALLOWED["emulator"] = {"emulator", "base"}
ALLOWED["base"] = {"base", "emulator"}  # base/cuda/headers.h names the emulated runtime in that mode
ALLOWED["bench"] = set(ORDER) | {"emulator"}  # bench/cuda measures the emulator itself
# Above the engine, the kernels are reached through ops only.
THROUGH_OPS = {"checkpoint", "nn", "planner", "optim"}
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
ROOMS_WITH_BACKEND_SWITCH = ("engine/cuda/", "base/cuda/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
BACKEND_SWITCH = re.compile(r"^\s*#\s*(if|elif|ifdef|ifndef)\b.*\bENGINE_HAS_CUDA\b")


def sources(root):
    for room in sorted(ALLOWED):
        top = os.path.join(root, room)
        for directory, _, files in os.walk(top):
            for name in sorted(files):
                if name.endswith(SOURCE_SUFFIXES):
                    path = os.path.join(directory, name)
                    yield room, os.path.relpath(path, root).replace(os.sep, "/")


def problems(root):
    found = []
    for room, path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
            lines = source.read().splitlines()
        for number, line in enumerate(lines, 1):
            include = INCLUDE.match(line)
            if include:
                target = include.group(1)
                target_room = target.split("/", 1)[0] if "/" in target else None
                if target_room in ALLOWED or target_room in ORDER:
                    if target_room not in ALLOWED[room]:
                        found.append(f"{path}:{number}: {room}/ includes {target}: {target_room}/ is above it")
                    elif room in THROUGH_OPS and (target_room == "kernels" or target == "engine/dispatch.h"):
                        found.append(f"{path}:{number}: {room}/ includes {target}: above the engine, kernels are "
                                     "reached through its ops")
            if BACKEND_SWITCH.match(line) and not path.startswith(ROOMS_WITH_BACKEND_SWITCH):
                found.append(f"{path}:{number}: #if on ENGINE_HAS_CUDA outside the device layer (engine/cuda/)")
    cuda = os.path.join(root, "kernels", "cuda")
    if os.path.isdir(cuda):
        for name in sorted(os.listdir(cuda)):
            if name.endswith(".cu"):
                twin = os.path.join(root, "kernels", "cpu", name[: -len(".cu")] + ".cpp")
                if not os.path.isfile(twin):
                    found.append(f"kernels/cuda/{name}: no CPU twin kernels/cpu/{name[:-3]}.cpp")
    return found


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as file:
        file.write(text)


def self_test():
    """Each broken rule, alone in a tree that otherwise passes, must be found; the clean tree must pass."""
    clean = {
        "base/error.h": "#pragma once\n",
        "kernels/cpu/gelu.cpp": '#include "base/error.h"\n',
        "kernels/cuda/gelu.cu": '#include "base/error.h"\n',
        "engine/ops/gelu.cpp": '#include "kernels/cpu/gelu.h"\n#include "engine/dispatch.h"\n',
        "engine/cuda/dispatch.h": "#if ENGINE_HAS_CUDA\n#endif\n",
        "nn/layers.cpp": '#include "engine/engine.h"\n#include "checkpoint/checkpoint.h"\n',
        "optim/trainer.cpp": '#include "planner/step_shape.h"\n',
        "bench/train.cpp": '#include "optim/trainer.h"\n#include "kernels/cpu/gelu.h"\n',
    }
    broken = {
        "kernels include the engine": ("kernels/cpu/gelu.cpp", '#include "engine/tensor.h"\n'),
        "kernels include nn": ("kernels/cuda/gelu.cu", '#include "nn/gpt.h"\n'),
        "engine includes optim": ("engine/ops/gelu.cpp", '#include "optim/trainer.h"\n'),
        "planner includes optim": ("planner/planner.cpp", '#include "optim/trainer.h"\n'),
        "nn reaches a kernel": ("nn/init.cpp", '#include "kernels/common/philox.h"\n'),
        "optim reaches the dispatch": ("optim/optimizer.cpp", '#include "engine/dispatch.h"\n'),
        "an op asks for the backend": ("engine/ops/rope.cpp", "#if ENGINE_HAS_CUDA\n#endif\n"),
        "a CUDA file without a twin": ("kernels/cuda/column_sums.cu", '#include "base/error.h"\n'),
        "the emulator includes the engine": ("emulator/cublas.cpp", '#include "engine/tensor.h"\n'),
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for path, text in clean.items():
            write(root, path, text)
        if problems(root):
            failures.append(f"the clean tree was refused: {problems(root)}")
        for what, (path, text) in broken.items():
            existed = os.path.exists(os.path.join(root, path))
            previous = open(os.path.join(root, path)).read() if existed else None
            write(root, path, text)
            if not problems(root):
                failures.append(f"not refused: {what} ({path})")
            if existed:
                write(root, path, previous)
            else:
                os.remove(os.path.join(root, path))
    for failure in failures:
        print(f"check_tree self-test: {failure}")
    print(f"check_tree self-test: {len(broken) - len(failures)} of {len(broken)} broken trees refused")
    return 1 if failures else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    found = problems(sys.argv[1])
    for problem in found:
        print(problem)
    checked = sum(1 for _ in sources(sys.argv[1]))
    print(f"check_tree: {checked} sources, {len(found)} broken rules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
