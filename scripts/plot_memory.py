#!/usr/bin/env python3
"""Draws a memory timeline that `train_gpt --memory-timeline FILE` wrote: one step's memory by category as a
stacked area over the step's allocations and frees, the phases shaded, the ops on the axis, and the plan's
predicted peak as a line. docs/MEMORY.md, "The memory timeline".

    python3 scripts/plot_memory.py FILE [--output PNG] [--device cpu|cuda]

The file is Chrome's trace format, so ui.perfetto.dev and chrome://tracing open it too (counter tracks per
category); this script reads the events libengine keeps beside them. Needs matplotlib (scripts/install_deps.sh).
"""
import argparse
import json
import sys

CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "workspace", "pinned_host"]
COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948"]
PHASE_SHADES = {"forward": "#ffffff", "backward": "#f2f2f2", "grad_norm": "#e6e6e6", "optimizer": "#d9d9d9"}


def fail(message):
    print(f"plot_memory: error: {message}", file=sys.stderr)
    sys.exit(2)


def read_timeline(path):
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        fail(f"{path} is not JSON: {error}")
    recording = document.get("libengine") if isinstance(document, dict) else None
    if not isinstance(recording, dict) or not isinstance(recording.get("events"), list):
        fail(f"{path} is not a libengine memory timeline (no 'libengine' events): write one with "
             "train_gpt --memory-timeline FILE")
    return recording


def series(recording, device):
    """The bytes of each category after every event of `device`'s account, with each event's op and phase."""
    start = recording.get("start", {}).get(device, {})
    current = {category: int(start.get(category, 0)) for category in CATEGORIES}
    totals = {category: [current[category]] for category in CATEGORIES}
    ops, phases = [""], ["forward"]
    for event in recording["events"]:
        if event.get("device") != device:
            continue
        category = event.get("category")
        if category not in current:
            fail(f"an event names an unknown category {category!r}")
        current[category] += int(event["bytes"])
        for name in CATEGORIES:
            totals[name].append(current[name])
        ops.append(event.get("op", ""))
        phases.append(event.get("phase", "forward"))
    return totals, ops, phases


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--output", help="the PNG to write (default: FILE with .png)")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="whose account to draw (default: the run's device)")
    arguments = parser.parse_args()
    recording = read_timeline(arguments.file)
    metadata = recording.get("metadata", {})
    device = arguments.device or metadata.get("device", "cpu")
    totals, ops, phases = series(recording, device)
    if len(ops) < 2:
        fail(f"{arguments.file} holds no allocation on {device}'s account")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("needs matplotlib (bash scripts/install_deps.sh installs python3-matplotlib)")

    mebibyte = 1024.0 * 1024.0
    positions = list(range(len(ops)))
    figure, axes = plt.subplots(figsize=(12, 5.5), dpi=110)
    # The phases as shaded bands behind the areas.
    start = 0
    for index in range(1, len(phases) + 1):
        if index == len(phases) or phases[index] != phases[start]:
            axes.axvspan(start, index - 1, color=PHASE_SHADES.get(phases[start], "#ffffff"), zorder=0)
            axes.text((start + index - 1) / 2, 0.98, phases[start], transform=axes.get_xaxis_transform(),
                      ha="center", va="top", fontsize=9, color="#555555", zorder=3)
            start = index
    drawn = [category for category in CATEGORIES if any(totals[category])]
    axes.stackplot(positions, [[value / mebibyte for value in totals[category]] for category in drawn],
                   labels=drawn, colors=[COLOURS[CATEGORIES.index(category)] for category in drawn], zorder=1)
    peak = max(sum(totals[category][index] for category in CATEGORIES) for index in positions)
    axes.axhline(peak / mebibyte, color="#333333", linewidth=0.8, linestyle=":",
                 label=f"measured peak {peak / mebibyte:.2f} MiB")
    predicted = metadata.get("predicted_peak_bytes")
    if predicted is not None:
        axes.axhline(predicted / mebibyte, color="#b00000", linewidth=1.2, linestyle="--",
                     label=f"predicted peak {predicted / mebibyte:.2f} MiB")
    # About a dozen ops on the axis, where the op changes.
    changes = [index for index in positions if index > 0 and ops[index] and ops[index] != ops[index - 1]]
    stride = max(1, len(changes) // 12)
    ticks = changes[::stride]
    axes.set_xticks(ticks)
    axes.set_xticklabels([ops[index] for index in ticks], rotation=45, ha="right", fontsize=8)
    axes.set_xlim(0, len(ops) - 1)
    axes.set_ylabel("MiB")
    axes.set_xlabel(f"allocations and frees of step {metadata.get('step', '?')}, in order ({len(ops) - 1} events)")
    axes.set_title(f"{metadata.get('model', '')}\n{metadata.get('shape', '')} on {device}", fontsize=9)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    output = arguments.output or (arguments.file.rsplit(".", 1)[0] + ".png")
    try:
        figure.savefig(output)
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror}")
    print(f"plot_memory: {output}: step {metadata.get('step', '?')}, {len(ops) - 1} events, peak "
          f"{peak / mebibyte:.2f} MiB" + (f", predicted {predicted / mebibyte:.2f} MiB" if predicted is not None else ""))


if __name__ == "__main__":
    main()
