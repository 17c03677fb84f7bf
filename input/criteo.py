"""Criteo's click logs as they come: tab-separated, no header, 40 fields a row: the label (0 or 1),
13 integer features (I1..I13) and 26 categorical ones (C1..C26, 8 hex digits each). Any field but
the label may be empty, as most rows have some: an empty integer reads as --numeric_default (0
unless set), an empty categorical as "" (one id of its own).

Files: train* and eval* in --data_dir (eval* in --eval_data_dir if set), such as Criteo's
train.txt, or its day files renamed train-day_0.gz ... (a name ending in .gz is read gzipped). Each
file is read in blocks of lines that are split and checked at once: a row with the wrong number of
fields, an empty or non-0/1 label or a non-integer in an integer column is named by its file and line
(`<file> record <line>: ...`, lines counted from 1) and stops training, or is skipped with
--skip_bad_records. Workers split the files between them when there are at least as many files as
workers, and the rows otherwise.
"""

import os

import tensorflow as tf

from ps_trainer.input import records as record_files
from ps_trainer.input import packing, tuning
from ps_trainer.input.specs import DataSpec

KIND = "files"
MULTI_VALUED = ()  # no multi-valued columns

LABEL = "label"
INTEGER = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = (LABEL, *INTEGER, *CATEGORICAL)
SEPARATOR = "\t"
PARALLEL_FILES = 4
_INTEGER = r"-?[0-9]+"


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}*")


def found_in(data_dir: str) -> bool:
    """Never guessed: train* also matches the other formats' files; --dataset=criteo says it."""
    return False


def _files(data_dir: str, split: str) -> list[str]:
    return sorted(path for path in tf.io.gfile.glob(pattern(data_dir, split)) if not tf.io.gfile.isdir(path))


def files(data_cfg, split: str) -> list[str]:
    return _files(data_cfg.split_dir(split), split)


def check(data_cfg):
    if not data_cfg.data_dir:
        return "--dataset=criteo needs --data_dir: a directory of train* files in Criteo's tab-separated layout."
    for split in ("train", "eval") if data_cfg.eval_data_dir else ("train",):
        files = _files(data_cfg.split_dir(split), split)
        if not files:
            directory = data_cfg.split_dir(split)
            return f"{directory} holds no {split} files (nothing matches {pattern(directory, split)})."
        refusal = record_files.gzip_refusal(files)
        if refusal:
            return refusal
    return None


def spec(data_cfg):
    features = {name: tf.TensorSpec([], tf.float32, name) for name in INTEGER}
    features.update({name: tf.TensorSpec([], tf.string, name) for name in CATEGORICAL})
    return DataSpec(features, 2)


def parse_block(path, indices, lines, numeric_default: float):
    """(bad [n], problems [k], (features, labels)) of a block of lines, for record_files.resolve()."""
    fields = tf.strings.split(lines, SEPARATOR)
    counts = fields.row_lengths()
    table = fields.to_tensor(default_value="", shape=[None, len(COLUMNS)])
    label_text = table[:, 0]
    integers = table[:, 1:1 + len(INTEGER)]
    empty = tf.equal(integers, "")
    not_integer = tf.logical_and(tf.logical_not(empty), tf.logical_not(tf.strings.regex_full_match(integers, _INTEGER)))
    failures = [
        (tf.not_equal(counts, len(COLUMNS)), lambda: tf.strings.join(
            ["has ", tf.strings.as_string(counts), f" tab-separated fields, not {len(COLUMNS)} (label, I1..I13, "
             "C1..C26)"])),
        (tf.equal(label_text, ""), "'label' is empty"),
        (tf.logical_not(tf.strings.regex_full_match(label_text, "[01]|")), lambda: tf.strings.join(
            ["'label' is '", label_text, "', not 0 or 1"])),
        (tf.reduce_any(not_integer, axis=1), lambda: tf.strings.join(
            ["'", tf.gather(INTEGER, tf.argmax(tf.cast(not_integer, tf.int32), axis=1)), "' is '",
             tf.gather(integers, tf.argmax(tf.cast(not_integer, tf.int32), axis=1), batch_dims=1),
             "', not an integer"])),
    ]
    bad, problems = record_files.name_bad_records(path, indices, failures)
    safe = tf.where(tf.logical_or(empty, not_integer), "0", integers)
    values = tf.where(empty, numeric_default, tf.strings.to_number(safe, tf.float32))
    features = {name: values[:, i] for i, name in enumerate(INTEGER)}
    features.update({name: table[:, 1 + len(INTEGER) + i] for i, name in enumerate(CATEGORICAL)})
    labels = tf.strings.to_number(tf.where(tf.equal(label_text, "1"), "1", "0"), tf.int64)
    return bad, problems, (features, labels)


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    files = _files(data_cfg.split_dir(split), split)
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(data_cfg.split_dir(split), split)}")
    by_file = len(files) >= shard.count

    def read_file(path):
        lines = tf.data.TextLineDataset(path, compression_type=record_files.compression(path))
        blocks = lines.batch(record_files.BLOCK).enumerate()
        return blocks.map(lambda block_number, lines: (path, block_number, lines))

    def checked(path, block_number, lines):
        indices = record_files.block_indices(block_number, tf.size(lines), first=1)  # line numbers
        if not by_file:  # every shard.count-th row of each file
            mine = tf.equal((indices - 1) % shard.count, shard.index)
            indices, lines = tf.boolean_mask(indices, mine), tf.boolean_mask(lines, mine)
        bad, problems, values = parse_block(path, indices, lines, data_cfg.numeric_default)
        return record_files.resolve(bad, problems, values, data_cfg.skip_bad_records)

    blocks = record_files.read_files(files[shard.index::shard.count] if by_file else files, PARALLEL_FILES, read_file,
                                     checked, data_cfg.skip_bad_records, feed=shard.feed)
    return record_files.settle(blocks, data_cfg.skip_bad_records)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    return record_files.file_shard_description(_files(data_cfg.split_dir(split), split), shard, unit="rows")
