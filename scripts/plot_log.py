#!/usr/bin/python3
"""Plots train_gpt JSON-lines logs against the step: loss (and validation loss when logged), learning rate,
gradient norm and peak memory by category. One line per log file, labelled by its name or by --label.

    scripts/plot_log.py LOG.jsonl [LOG2.jsonl ...] -o out.png [--label NAME ...] [--title TEXT]
    scripts/plot_log.py A.jsonl B.jsonl -o cmp.png --relative   # adds |loss_i / loss_1 - 1| per step

Uses matplotlib (Debian's python3-matplotlib, installed by scripts/install_deps.sh) without a display.
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def read_log(path):
    records = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                sys.exit(f"plot_log: {path}:{number}: not JSON ({error})")
    if not records:
        sys.exit(f"plot_log: {path}: no records")
    return records


def series(records, key):
    points = [(record["step"], record[key]) for record in records if key in record and record[key] is not None]
    return [step for step, _ in points], [value for _, value in points]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="train_gpt --log files (JSON lines)")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("--label", action="append", default=[], help="legend name per log, in order")
    parser.add_argument("--title", default="")
    parser.add_argument("--relative", action="store_true",
                        help="also plot each log's loss relative to the first log's, step by step")
    arguments = parser.parse_args()
    if arguments.label and len(arguments.label) != len(arguments.logs):
        sys.exit(f"plot_log: {len(arguments.label)} labels for {len(arguments.logs)} logs")
    labels = arguments.label or [pathlib.Path(path).stem for path in arguments.logs]
    logs = [read_log(path) for path in arguments.logs]

    panels = ["loss", "lr", "grad_norm", "memory"] + (["relative"] if arguments.relative else [])
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True)
    by_name = dict(zip(panels, axes))
    for records, label in zip(logs, labels):
        steps, loss = series(records, "loss")
        by_name["loss"].plot(steps, loss, label=f"{label} train")
        eval_steps, eval_loss = series(records, "eval_loss")
        if eval_steps:
            by_name["loss"].plot(eval_steps, eval_loss, "--", label=f"{label} validation")
        by_name["lr"].plot(*series(records, "lr"), label=label)
        by_name["grad_norm"].plot(*series(records, "grad_norm"), label=label)
        categories = sorted({name for record in records for name in record.get("peak_mib", {})})
        for category in categories:
            points = [(record["step"], record["peak_mib"][category]) for record in records
                      if category in record.get("peak_mib", {})]
            by_name["memory"].plot([s for s, _ in points], [v for _, v in points], label=f"{label} {category}")
    if arguments.relative:
        base = dict(zip(*series(logs[0], "loss")))
        for records, label in zip(logs[1:], labels[1:]):
            steps, loss = series(records, "loss")
            shared = [(step, value) for step, value in zip(steps, loss) if step in base and base[step] != 0]
            by_name["relative"].plot([s for s, _ in shared], [abs(v / base[s] - 1) * 100 for s, v in shared],
                                     label=f"{label} vs {labels[0]}")
        by_name["relative"].set_ylabel("|loss ratio - 1| (%)")
    by_name["loss"].set_ylabel("loss")
    by_name["lr"].set_ylabel("learning rate")
    by_name["grad_norm"].set_ylabel("grad norm")
    by_name["memory"].set_ylabel("peak MiB")
    axes[-1].set_xlabel("optimizer step")
    for axis in axes:
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    if arguments.title:
        figure.suptitle(arguments.title)
    figure.tight_layout()
    figure.savefig(arguments.output, dpi=100)
    print(f"plot_log: wrote {arguments.output}")


if __name__ == "__main__":
    main()
