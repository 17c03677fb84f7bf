#!/usr/bin/env python3
"""Turns a run's event files into a PNG: loss and accuracy (and AUC, if logged) against the global
step, training (the chief's summaries in --model_dir) beside evaluation (--model_dir/eval).

    python scripts/plot_run.py --model_dir=runs/20261122-101500/model --output=run.png
"""

import collections
import os

import matplotlib
from absl import app, flags

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402

from ps_trainer.cluster import model_dir as layout  # noqa: E402

flags.DEFINE_string("model_dir", None, "The run's --model_dir.", required=True)
flags.DEFINE_string("output", None, "PNG to write. Default: <model_dir>/run.png.")
FLAGS = flags.FLAGS
METRICS = ("loss", "accuracy", "auc")


def read_scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the event files directly in `directory`."""
    series = collections.defaultdict(dict)
    for path in sorted(tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    series[value.tag][event.step] = value.simple_value  # a rerun's later value wins
    return {tag: sorted(points.items()) for tag, points in series.items()}


def plot(model_dir: str, output: str) -> list[str]:
    """Writes the figure; returns the metrics it shows."""
    runs = {"train": read_scalars(model_dir), "eval": read_scalars(layout.eval_dir(model_dir))}
    shown = [m for m in METRICS if any(m in series for series in runs.values())]
    if not shown:
        raise app.UsageError(f"{model_dir}: no loss, accuracy or auc summaries in its event files")
    figure, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], shown):
        for run, series in runs.items():
            if metric in series:
                steps, values = zip(*series[metric])
                ax.plot(steps, values, marker="o" if run == "eval" else None, label=run)
        ax.set_title(metric)
        ax.set_xlabel("global step")
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle(model_dir, fontsize=8)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return shown


def main(argv):
    output = FLAGS.output or layout.plot(FLAGS.model_dir)
    shown = plot(FLAGS.model_dir, output)
    print(f"wrote {output} ({', '.join(shown)})")


if __name__ == "__main__":
    app.run(main)
