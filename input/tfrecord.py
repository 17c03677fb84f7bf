"""TFRecord files of tf.train.Example.

--data_dir holds train-*.tfrecord and eval-*.tfrecord (scripts/convert_to_tfrecord.py writes them from
any dataset the trainer reads). An example holds either an 'image' (raw uint8 bytes,
28x28x1) and a 'label' (int64), or, with --numeric_columns/--categorical_columns, those columns
(float and bytes) and the --label_column; a --multi_valued_columns column is a list of any length, bytes
or int64 (as the first record holds it), read as one field of its values between the separator.

Workers split the files between them when there are at least as many files as workers, and split
the records otherwise; files are read in parallel. A record that is unreadable, lacks a feature,
has an image of the wrong size or a label out of range stops training with its file and index, or
with --skip_bad_records is dropped and logged.
"""

import os

import numpy as np
import tensorflow as tf

from ps_trainer.input import records as record_files
from ps_trainer.input import packing, synthetic, tuning
from ps_trainer.input.specs import tabular_spec

KIND = "files"
MULTI_VALUED = None  # any of its columns can be multi-valued (--multi_valued_columns)

PARALLEL_FILES = 4


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}-*.tfrecord")


def files(data_cfg, split: str) -> list[str]:
    return sorted(tf.io.gfile.glob(pattern(data_cfg.split_dir(split), split)))


def found_in(data_dir: str) -> bool:
    return bool(tf.io.gfile.glob(pattern(data_dir, "train")))


def check(data_cfg):
    if not data_cfg.data_dir:
        return f"--dataset={data_cfg.name} needs --data_dir: a directory of train-*.tfrecord files."
    for split in ("train", "eval") if data_cfg.eval_data_dir else ("train",):
        if not tf.io.gfile.glob(pattern(data_cfg.split_dir(split), split)):
            flag = "--eval_data_dir" if split == "eval" else "--data_dir"
            return (f"{flag}={data_cfg.split_dir(split)} holds no {split} files "
                    f"(nothing matches {pattern(data_cfg.split_dir(split), split)}).")
    return None


def spec(data_cfg):
    tabular = data_cfg.numeric_columns or data_cfg.categorical_columns or data_cfg.multi_valued_columns
    return tabular_spec(data_cfg) if tabular else synthetic.spec(data_cfg)


def _kind(dtype) -> str:
    return {tf.uint8: "bytes", tf.string: "bytes", tf.float32: "float"}[dtype]


def example_proto(features: dict, label: int, data_spec, label_name: str = "label") -> bytes:
    """One serialized tf.train.Example of this format, from numpy/python values (a multi-valued column's
    field, values between separators, as a bytes list of its values)."""
    feature = {label_name: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
    for name, value_spec in data_spec.features.items():
        value = features[name]
        if name in data_spec.separators:
            raw = value if isinstance(value, bytes) else str(value).encode()
            values = [v for v in raw.split(data_spec.separators[name].encode()) if v]
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        elif value_spec.dtype == tf.uint8:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.asarray(value).tobytes()]))
        elif value_spec.dtype == tf.string:
            raw = value if isinstance(value, bytes) else str(value).encode()
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _first_values(sparse: tf.SparseTensor, n, default) -> tuple[tf.Tensor, tf.Tensor]:
    """(how many values each of n records has, each record's first value or default)."""
    rows = tf.cast(sparse.indices[:, 0], tf.int32)
    counts = tf.math.bincount(rows, minlength=n, maxlength=n, dtype=tf.int64)

    def gather_firsts():
        starts = tf.cumsum(counts, exclusive=True)
        padded = tf.concat([sparse.values, [default]], 0)
        return tf.gather(padded, tf.where(counts > 0, starts, tf.size(sparse.values, out_type=tf.int64)))

    # The usual block, one value per record, needs no copy.
    return counts, tf.cond(tf.reduce_all(tf.equal(counts, 1)), lambda: sparse.values, gather_firsts)


def _count_failure(what: str, counts):
    """(failed [n], message) for records without exactly one value of a feature, for name_bad_records()."""
    return tf.not_equal(counts, 1), lambda: tf.strings.join([f"needs one {what} feature, has ",
                                                             tf.strings.as_string(counts)])


def _image(name: str, value_spec, first):
    """(uint8 images [n, *shape], (failed [n], message) for a record whose bytes are not one image)."""
    size = value_spec.shape.num_elements()
    length = tf.strings.length(first)
    fits = tf.equal(length, size)
    shape = "x".join(map(str, value_spec.shape))
    failure = (tf.logical_not(fits), lambda: tf.strings.join(
        [f"'{name}' has ", tf.strings.as_string(length), f" bytes, expected {size} ({shape} uint8)"]))
    # decode_raw needs equal lengths: zeros stand in for a bad record's image (never used).
    raw = tf.cond(tf.reduce_all(fits), lambda: first, lambda: tf.where(fits, first, b"\0" * size))
    return tf.reshape(tf.io.decode_raw(raw, tf.uint8), [-1, *value_spec.shape]), failure


def list_kinds(path: str, names) -> dict:
    """{each of `names`: tf.int64 if the file's first record holds it as an int64 list, else tf.string}."""
    kinds = dict.fromkeys(names, tf.string)
    if not names:
        return kinds
    # Read in Python: blocks() may be built inside a dataset's function (the input queue's passes).
    for serialized in tf.compat.v1.io.tf_record_iterator(path):
        example = tf.train.Example.FromString(serialized)
        for name in names:
            if name in example.features.feature and example.features.feature[name].WhichOneof("kind") == "int64_list":
                kinds[name] = tf.int64
        break
    return kinds


def _joined(name: str, sparse: tf.SparseTensor, n, separator: str):
    """(a multi-valued feature's values as one field per record, joined by the separator; (failed [n],
    message) for a record with a value that holds the separator, which the model would split)."""
    values = sparse.values if sparse.dtype == tf.string else tf.strings.as_string(sparse.values)
    ragged = tf.RaggedTensor.from_value_rowids(values, sparse.indices[:, 0], nrows=tf.cast(n, tf.int64))
    holds = tf.strings.split(values, sep=separator).row_lengths() > 1
    held = tf.reduce_any(tf.RaggedTensor.from_value_rowids(holds, sparse.indices[:, 0], nrows=tf.cast(n, tf.int64)),
                         axis=1)
    failure = (held, lambda: tf.strings.join([f"'{name}' holds a value with its separator '{separator}' "
                                              "(--multi_valued_columns), which would split it: give another"]))
    return tf.strings.reduce_join(ragged, axis=1, separator=separator), failure


def decoder(data_spec, label_name: str, kinds: dict | None = None):
    """decode(path, indices [n], serialized [n]) -> (bad [n], problems [k], (features, labels)), for
    records.tfrecord_blocks. A problem names the first thing wrong with a record. A multi-valued column
    (data_spec.separators; its list's kind in `kinds`, bytes unless said) holds any number of values, read as
    one field of values between separators, as the model takes it."""
    kinds = kinds or {}
    parse_spec = {name: tf.io.VarLenFeature(kinds.get(name, tf.string) if name in data_spec.separators else
                                            tf.string if s.dtype == tf.uint8 else s.dtype)
                  for name, s in data_spec.features.items()}
    parse_spec[label_name] = tf.io.VarLenFeature(tf.int64)
    defaults = {tf.uint8: b"", tf.string: b"", tf.float32: 0.0}

    def decode(path, indices, serialized):
        # Variable-length, so that a missing or repeated feature is reported as this record's
        # problem; a record that is no Example, or holds the wrong kind of list, fails the parse
        # with TensorFlow's own message, which names the record by its example name.
        names = tf.strings.join([path, " record ", tf.strings.as_string(indices)])
        parsed = tf.io.parse_example(serialized, parse_spec, example_names=names)
        n = tf.size(serialized)
        failures, features = [], {}
        for name, value_spec in data_spec.features.items():
            if name in data_spec.separators:
                features[name], failure = _joined(name, parsed[name], n, data_spec.separators[name])
                failures.append(failure)
                continue
            counts, first = _first_values(parsed[name], n, defaults[value_spec.dtype])
            failures.append(_count_failure(f"'{name}' {_kind(value_spec.dtype)}", counts))
            if value_spec.dtype == tf.uint8:
                first, failure = _image(name, value_spec, first)
                failures.append(failure)
            features[name] = first
        counts, labels = _first_values(parsed[label_name], n, tf.constant(0, tf.int64))
        failures.append(_count_failure(f"int64 '{label_name}'", counts))
        failures.append(record_files.label_failure(labels, label_name, data_spec.num_classes))
        bad, problems = record_files.name_bad_records(path, indices, failures)
        return bad, problems, (features, labels)

    return decode


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    data_dir = data_cfg.split_dir(split)
    files = sorted(tf.io.gfile.glob(pattern(data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(data_dir, split)}")
    data_spec = spec(data_cfg)
    decode = decoder(data_spec, data_cfg.label_column, list_kinds(files[0], data_spec.separators))
    skip = data_cfg.skip_bad_records
    if len(files) >= shard.count:  # whole files per worker
        blocks = record_files.tfrecord_blocks(files[shard.index::shard.count], PARALLEL_FILES, decode, skip,
                                              feed=shard.feed)
    else:  # every shard.count-th record of each file
        blocks = record_files.tfrecord_blocks(files, PARALLEL_FILES, decode, skip,
                                              keep=lambda indices: tf.equal(indices % shard.count, shard.index))
    return record_files.settle(blocks, skip)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    files = sorted(tf.io.gfile.glob(pattern(data_cfg.split_dir(split), split)))
    return record_files.file_shard_description(files, shard)


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
