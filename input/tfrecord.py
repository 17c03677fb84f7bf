"""TFRecord files of tf.train.Example.

--data_dir holds train-*.tfrecord and eval-*.tfrecord (scripts/write_tfrecords.py and
scripts/convert_to_tfrecord.py write them). An example holds either an 'image' (raw uint8 bytes,
28x28x1) and a 'label' (int64), or, with --numeric_columns/--categorical_columns, those columns
(float and bytes) and the --label_column.

Workers split the files between them when there are at least as many files as workers, and split
the records otherwise; files are read in parallel. A record that is unreadable, lacks a feature,
has an image of the wrong size or a label out of range stops training with its file and index, or
with --skip_bad_records is dropped and logged.
"""

import os

import numpy as np
import tensorflow as tf

from input import records as record_files
from input import synthetic, tuning
from input.specs import tabular_spec

PARALLEL_FILES = 4


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}-*.tfrecord")


def check(cfg):
    if not cfg.data_dir:
        return f"--dataset={cfg.name} needs --data_dir: a directory of train-*.tfrecord files."
    for split in ("train", "eval") if cfg.eval_data_dir else ("train",):
        if not tf.io.gfile.glob(pattern(cfg.split_dir(split), split)):
            flag = "--eval_data_dir" if split == "eval" else "--data_dir"
            return (f"{flag}={cfg.split_dir(split)} holds no {split} files "
                    f"(nothing matches {pattern(cfg.split_dir(split), split)}).")
    return None


def spec(cfg):
    return tabular_spec(cfg) if cfg.numeric_columns or cfg.categorical_columns else synthetic.spec(cfg)


def _kind(dtype) -> str:
    return {tf.uint8: "bytes", tf.string: "bytes", tf.float32: "float"}[dtype]


def example_proto(features: dict, label: int, data_spec, label_name: str = "label") -> bytes:
    """One serialized tf.train.Example of this format, from numpy/python values."""
    feature = {label_name: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
    for name, value_spec in data_spec.features.items():
        value = features[name]
        if value_spec.dtype == tf.uint8:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.asarray(value).tobytes()]))
        elif value_spec.dtype == tf.string:
            raw = value if isinstance(value, bytes) else str(value).encode()
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def parser(data_spec, label_name: str):
    """(path, index, serialized, problem) -> (path, index, problem, features, label); problem names
    the first thing wrong with the record (the record's own problem first), or is ""."""
    parse_spec = {name: tf.io.VarLenFeature(tf.string if s.dtype == tf.uint8 else s.dtype)
                  for name, s in data_spec.features.items()}
    parse_spec[label_name] = tf.io.VarLenFeature(tf.int64)

    def parse(path, index, serialized, problem):
        # Variable-length, so that a missing or repeated feature is reported as this record's
        # problem rather than failing the parse with no record named.
        parsed = tf.io.parse_single_example(serialized, parse_spec)
        checks = [(tf.not_equal(problem, ""), problem)]
        features = {}
        for name, value_spec in data_spec.features.items():
            values = parsed[name].values
            kind = _kind(value_spec.dtype)
            checks.append((tf.not_equal(tf.size(values), 1), tf.strings.join(
                [f"needs one '{name}' {kind} feature, has ", tf.strings.as_string(tf.size(values))])))
            first = tf.concat([values, tf.zeros([1], values.dtype)], 0)[0]
            if value_spec.dtype == tf.uint8:
                size = value_spec.shape.num_elements()
                length = tf.strings.length(first)
                checks.append((tf.not_equal(length, size), tf.strings.join(
                    [f"'{name}' has ", tf.strings.as_string(length), f" bytes, expected {size} "
                     f"({'x'.join(map(str, value_spec.shape))} uint8)"])))
                first = tf.where(tf.equal(length, size), first, tf.constant(b"\0" * size))
                first = tf.reshape(tf.io.decode_raw(first, tf.uint8), value_spec.shape)
            features[name] = first
        labels = parsed[label_name].values
        label = tf.concat([labels, [0]], 0)[0]
        checks.append((tf.not_equal(tf.size(labels), 1), tf.strings.join(
            [f"needs one int64 '{label_name}' feature, has ", tf.strings.as_string(tf.size(labels))])))
        checks.append((tf.logical_or(label < 0, label >= data_spec.num_classes), tf.strings.join(
            [f"'{label_name}' is ", tf.strings.as_string(label), f", outside 0..{data_spec.num_classes - 1}"])))
        found = tf.constant("")
        for failed, message in reversed(checks):  # the first that applies is reported
            found = tf.where(failed, message, found)
        label = tf.where(tf.equal(found, ""), label, tf.constant(0, tf.int64))
        return path, index, found, features, label

    return parse


def records(cfg, split: str, shard) -> tf.data.Dataset:
    data_dir = cfg.split_dir(split)
    files = sorted(tf.io.gfile.glob(pattern(data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(data_dir, split)}")
    by_file = len(files) >= shard.count
    dataset = record_files.read_files(files[shard.index::shard.count] if by_file else files, PARALLEL_FILES)
    if not by_file:
        dataset = dataset.shard(shard.count, shard.index)
    dataset = dataset.map(parser(spec(cfg), cfg.label_column), num_parallel_calls=tuning.PARALLEL_CALLS,
                          deterministic=True)
    return record_files.check_or_skip(dataset, cfg.skip_bad_records)


def write(examples, data_spec, data_dir: str, split: str, num_files: int, label_name: str = "label") -> list[str]:
    """Writes (features, label) pairs round-robin into num_files files of `split`; returns the paths.

    Each file is written under a temporary name and renamed when complete, so a reader never sees
    a half-written file under a name it would match.
    """
    tf.io.gfile.makedirs(data_dir)
    paths = [os.path.join(data_dir, f"{split}-{i:05d}-of-{num_files:05d}.tfrecord")
             for i in range(num_files)]
    writers = [tf.io.TFRecordWriter(path + ".incomplete") for path in paths]
    try:
        for i, (features, label) in enumerate(examples):
            writers[i % num_files].write(example_proto(features, label, data_spec, label_name))
    finally:
        for writer in writers:
            writer.close()
    for path in paths:
        tf.io.gfile.rename(path + ".incomplete", path, overwrite=True)
    return paths
