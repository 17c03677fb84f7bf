#!/usr/bin/env python3
"""Benchmarks the input pipeline on files: speed against plain tf.data, memory as the data grows.

    python scripts/input_benchmark.py                     # 100,000 examples (and 400,000), 5 repetitions
    python scripts/input_benchmark.py --examples=300000 --formats=tfrecord --repetitions=5

Writes the embedded synthetic images as TFRecord, CSV (784 pixel columns) and IDX files, once at
--examples and once at 4x that, into --work_dir (kept between runs; --rewrite redoes them). Then:
- speed: one epoch of each format through the project's pipeline (input.batches: streamed,
  checked, shuffled, batched) and through the plain tf.data reader a tutorial would write for the
  same files (interleave, shuffle, batch, parse the batch), alternating, --repetitions times; the
  figure is the median ratio;
- memory: the peak RSS of a fresh process reading one epoch of the 1x and of the 4x data through
  the pipeline (and, for TFRecord, with --cache=memory, for its cost);
- training: single-process MLP training (trainer.py) from the 1x TFRecord files against the
  embedded data, in examples per second after a warm-up.
Targets (issue 11): ratio >= 0.9 on tfrecord and idx; RSS growth 1x -> 4x under 64 MiB; training
from files >= 0.8x of the embedded data.
"""

import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("examples", 100000, "Training examples of the 1x dataset.", lower_bound=1000)
flags.DEFINE_list("formats", ["tfrecord", "idx", "csv"], "Formats to measure.")
flags.DEFINE_boolean("training", True, "Also compare single-process training from files with the embedded data.")
flags.DEFINE_integer("repetitions", 5, "Repetitions of each reader (alternating; this shared VM's speed "
                     "varies by a third from one minute to the next).", lower_bound=1)
flags.DEFINE_integer("batch_size", 256, "Batch size of both readers.", lower_bound=1)
flags.DEFINE_string("work_dir", os.path.join(tempfile.gettempdir(), "ps-trainer-input-benchmark"),
                    "Where the datasets are written (kept, about 1.5 GB at the default size).")
flags.DEFINE_boolean("rewrite", False, "Write the datasets again even if present.")
flags.DEFINE_boolean("write_only", False, "Write the datasets and stop.")
flags.DEFINE_integer("train_steps", 2500, "Steps of each training run (the first 500 are warm-up).",
                     lower_bound=1000)
flags.DEFINE_string("read_one_epoch", None, "Internal: read one epoch of this data dir and print peak RSS.")
flags.DEFINE_string("read_format", None, "Internal: the format of --read_one_epoch.")
flags.DEFINE_string("read_cache", None, "Internal: --cache of --read_one_epoch.")
FLAGS = flags.FLAGS

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABULAR = {"label_column": "label", "numeric_columns": tuple(f"p{i}" for i in range(784))}
WARMUP_STEPS = 500


# ---------------------------------------------------------------- datasets

def write_datasets(base: pathlib.Path, examples: int) -> None:
    import numpy as np  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)

    from ps_trainer import input as inputs  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    from ps_trainer.input import idx, synthetic, tfrecord  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    done = base / "complete"
    if done.exists() and not FLAGS.rewrite:
        return
    print(f"writing {examples} examples as tfrecord, csv and idx into {base} ...", flush=True)
    cfg = inputs.DataConfig(synthetic_examples=examples)
    images, labels = [], []
    for features, label in synthetic.records(cfg, "train", inputs.Shard(0, 1)).batch(4096):
        images.append(features["image"].numpy())
        labels.append(label.numpy())
    images, labels = np.concatenate(images), np.concatenate(labels)
    tfrecord.write((({"image": image}, label) for image, label in zip(images, labels)),
                   synthetic.spec(cfg), str(base / "tfrecord"), "train", num_files=4)
    idx.write(images[..., 0], labels, str(base / "idx"), "train")
    (base / "csv").mkdir(parents=True, exist_ok=True)
    flat = images.reshape(len(images), -1)
    for part in range(4):
        rows = range(part, len(images), 4)
        with open(base / "csv" / f"train-{part}.csv", "w") as f:
            f.write(",".join(["label", *TABULAR["numeric_columns"]]) + "\n")
            for i in rows:
                f.write(f"{labels[i]}," + ",".join(map(str, flat[i])) + "\n")
    done.write_text("ok\n")


def data_config(fmt: str, data_dir: str, cache: str | None = None):
    from ps_trainer import input as inputs  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    extra = TABULAR if fmt == "csv" else {}
    return inputs.DataConfig(name=fmt, data_dir=data_dir, cache=cache, num_classes=10, **extra)


# ---------------------------------------------------------------- readers

def project_reader(fmt: str, data_dir: str):
    from ps_trainer import input as inputs  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    return inputs.batches(data_config(fmt, data_dir), inputs.Shard(0, 1), FLAGS.batch_size, repeat=False)


def plain_reader(fmt: str, data_dir: str):
    """What a tutorial writes: no record is checked or named."""
    import tensorflow as tf  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)

    from ps_trainer.input import tuning  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    directory = pathlib.Path(data_dir)
    if fmt == "tfrecord":
        files = sorted(str(p) for p in directory.glob("train-*.tfrecord"))
        parse = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

        def decode(serialized):
            parsed = tf.io.parse_example(serialized, parse)
            return {"image": tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), [-1, 28, 28, 1])}, parsed["label"]

        dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4)
        batched = dataset.shuffle(10000).batch(FLAGS.batch_size).map(decode, num_parallel_calls=tuning.PARALLEL_CALLS)
    elif fmt == "idx":
        images = tf.data.FixedLengthRecordDataset(str(directory / "train-images-idx3-ubyte"), 784, header_bytes=16)
        labels = tf.data.FixedLengthRecordDataset(str(directory / "train-labels-idx1-ubyte"), 1, header_bytes=8)

        def decode(image, label):
            return ({"image": tf.reshape(tf.io.decode_raw(image, tf.uint8), [-1, 28, 28, 1])},
                    tf.cast(tf.io.decode_raw(label, tf.uint8)[:, 0], tf.int64))

        batched = tf.data.Dataset.zip((images, labels)).shuffle(10000).batch(FLAGS.batch_size).map(
            decode, num_parallel_calls=tuning.PARALLEL_CALLS)
    else:
        files = sorted(str(p) for p in directory.glob("train-*.csv"))
        types = [tf.int64] + [tf.float32] * len(TABULAR["numeric_columns"])

        def rows(path):
            return tf.data.experimental.CsvDataset(path, types, header=True)

        def split(label, *columns):
            return dict(zip(TABULAR["numeric_columns"], columns)), label

        dataset = tf.data.Dataset.from_tensor_slices(files).interleave(rows, cycle_length=4, num_parallel_calls=4)
        batched = dataset.shuffle(10000).batch(FLAGS.batch_size).map(split, num_parallel_calls=tuning.PARALLEL_CALLS)
    return tuning.without_autotune(batched.prefetch(tuning.PREFETCH_BATCHES))


def examples_per_sec(dataset) -> tuple[float, int]:
    start, count = time.perf_counter(), 0
    for _, labels in dataset:
        count += int(labels.shape[0])
    return count / (time.perf_counter() - start), count


def speed(fmt: str, data_dir: str) -> dict:
    rates = {"project": [], "plain": []}
    counts = set()
    readers = [("project", project_reader), ("plain", plain_reader)]
    for repetition in range(FLAGS.repetitions):
        for name, reader in readers if repetition % 2 == 0 else readers[::-1]:  # neither always goes first
            rate, count = examples_per_sec(reader(fmt, data_dir))
            rates[name].append(rate)
            counts.add(count)
    ratios = [p / q for p, q in zip(rates["project"], rates["plain"])]
    return {"project": statistics.median(rates["project"]), "plain": statistics.median(rates["plain"]),
            "ratio": statistics.median(ratios), "examples": sorted(counts)}


# ---------------------------------------------------------------- memory

def read_one_epoch() -> None:
    """In a fresh process: one epoch through the pipeline, then this process's peak RSS."""
    from ps_trainer import input as inputs  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    cfg = data_config(FLAGS.read_format, FLAGS.read_one_epoch, FLAGS.read_cache)
    count = 0
    for _, labels in inputs.batches(cfg, inputs.Shard(0, 1), FLAGS.batch_size, repeat=False):
        count += int(labels.shape[0])
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child started by
    # a large parent reports the parent's peak.
    status = pathlib.Path("/proc/self/status").read_text().splitlines()
    peak = next(line for line in status if line.startswith("VmHWM:"))
    print(f"examples={count} peak_rss_kib={peak.split()[1]}")


def peak_rss_mib(fmt: str, data_dir: pathlib.Path, cache: str | None = None) -> float:
    args = [sys.executable, __file__, f"--read_one_epoch={data_dir}", f"--read_format={fmt}",
            f"--batch_size={FLAGS.batch_size}"] + ([f"--read_cache={cache}"] if cache else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=True).stdout
    return int(out.split("peak_rss_kib=")[1].split()[0]) / 1024


# ---------------------------------------------------------------- training

def training_rate(data_args: list[str], model_dir: pathlib.Path) -> float:
    from ps_trainer.training import log_lines  # noqa: PLC0415  (loaded where used: each reader is timed with only its own imports)
    batch = 128
    args = [sys.executable, str(ROOT / "trainer.py"), f"--model_dir={model_dir}", "--model=mlp",
            f"--batch_size={batch}", f"--train_steps={FLAGS.train_steps}", "--log_every_n_steps=50",
            "--save_checkpoint_secs=100000", "--save_summaries_steps=100000", "--export_saved_model=false",
            "--not_learning=off", *data_args]
    log = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=True).stderr
    rate = log_lines.examples_per_sec(log, batch, WARMUP_STEPS)
    if rate is None:
        raise RuntimeError(f"no progress past step {WARMUP_STEPS} in the log of {' '.join(args)}")
    return rate


def main(argv):
    if FLAGS.read_one_epoch:
        read_one_epoch()
        return
    base = pathlib.Path(FLAGS.work_dir)
    sizes = {"1x": base / f"{FLAGS.examples}", "4x": base / f"{4 * FLAGS.examples}"}
    write_datasets(sizes["1x"], FLAGS.examples)
    write_datasets(sizes["4x"], 4 * FLAGS.examples)
    if FLAGS.write_only:
        return
    print(f"\nspeed: one epoch of {FLAGS.examples} examples, batch {FLAGS.batch_size}, median of "
          f"{FLAGS.repetitions} (alternating)")
    print(f"{'format':9} {'pipeline ex/s':>14} {'plain tf.data ex/s':>19} {'ratio':>6}")
    for fmt in FLAGS.formats:
        result = speed(fmt, str(sizes["1x"] / fmt))
        print(f"{fmt:9} {result['project']:14,.0f} {result['plain']:19,.0f} {result['ratio']:6.2f}", flush=True)
    print("\nmemory: peak RSS of one epoch in a fresh process")
    print(f"{'format':18} {'1x MiB':>8} {'4x MiB':>8} {'growth MiB':>11}")
    cases = [(fmt, None) for fmt in FLAGS.formats]
    if "tfrecord" in FLAGS.formats:
        cases.append(("tfrecord", "memory"))
    for fmt, cache in cases:
        one, four = (peak_rss_mib(fmt, sizes[size] / fmt, cache) for size in ("1x", "4x"))
        label = fmt + (f" --cache={cache}" if cache else "")
        print(f"{label:18} {one:8.0f} {four:8.0f} {four - one:11.0f}", flush=True)
    if not FLAGS.training:
        return
    print(f"\ntraining: single-process mlp, batch 128, {FLAGS.train_steps} steps, examples/s after step {WARMUP_STEPS}")
    rates = {"embedded": [], "files": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repetition in range(max(1, FLAGS.repetitions // 2)):
            rates["embedded"].append(training_rate([], pathlib.Path(tmp) / f"embedded-{repetition}"))
            rates["files"].append(training_rate(["--dataset=tfrecord", f"--data_dir={sizes['1x'] / 'tfrecord'}"],
                                                pathlib.Path(tmp) / f"files-{repetition}"))
    ratio = statistics.median(f / e for f, e in zip(rates["files"], rates["embedded"]))
    print(f"embedded data {statistics.median(rates['embedded']):,.0f} ex/s; tfrecord files "
          f"{statistics.median(rates['files']):,.0f} ex/s; ratio {ratio:.2f} (median of {len(rates['files'])})")


if __name__ == "__main__":
    app.run(main)
