"""CSV files with a header row: train-*.csv and eval-*.csv in --data_dir (eval in --eval_data_dir).

--label_column names the int64 class column; --numeric_columns (read as float) and
--categorical_columns (read as strings) name the features. Other columns are ignored. An empty
numeric field reads as --numeric_default (0 unless set), an empty categorical one as "", and an
empty label is a bad record named by its file and row. Workers split
the files between them when there are at least as many files as workers, and the rows otherwise.
A label out of range is reported with its file and row (or skipped, with --skip_bad_records); a
row TensorFlow cannot parse stops training with TensorFlow's own message.
"""

import csv
import io
import os

import tensorflow as tf

from input import records as record_files
from input import packing, tuning
from input.specs import tabular_spec

KIND = "files"

PARALLEL_FILES = 4
EMPTY_LABEL = -2**63  # what an empty label field reads as: no real label is that


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}-*.csv")


def header(path: str) -> list[str]:
    with tf.io.gfile.GFile(path) as f:
        return next(csv.reader(io.StringIO(f.readline())), [])


def files(cfg, split: str) -> list[str]:
    return sorted(tf.io.gfile.glob(pattern(cfg.split_dir(split), split)))


def found_in(data_dir: str) -> bool:
    return bool(tf.io.gfile.glob(pattern(data_dir, "train")))


def check(cfg):
    if not cfg.data_dir:
        return "--dataset=csv needs --data_dir: a directory of train-*.csv files with a header row."
    if not cfg.numeric_columns and not cfg.categorical_columns:
        return "--dataset=csv needs --numeric_columns and/or --categorical_columns: the feature columns."
    for split in ("train", "eval") if cfg.eval_data_dir else ("train",):
        wanted = pattern(cfg.split_dir(split), split)
        files = sorted(tf.io.gfile.glob(wanted))
        if not files:
            return f"{cfg.split_dir(split)} holds no {split} files (nothing matches {wanted})."
        columns = header(files[0])
        for name in (cfg.label_column, *cfg.numeric_columns, *cfg.categorical_columns):
            if name not in columns:
                return f"{files[0]}: no column '{name}' in its header ({', '.join(columns)})."
    return None


def spec(cfg):
    return tabular_spec(cfg)


@tuning.pipeline
def blocks(cfg, split: str, shard) -> tf.data.Dataset:
    data_dir = cfg.split_dir(split)
    files = sorted(tf.io.gfile.glob(pattern(data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(data_dir, split)}")
    columns = header(files[0])
    # Defaults with a value let a field be empty (dtype-only ones refuse it, naming neither file nor
    # row); the label's is a sentinel that check_labels reports.
    wanted = {cfg.label_column: tf.constant(EMPTY_LABEL, tf.int64),
              **{n: tf.constant(cfg.numeric_default, tf.float32) for n in cfg.numeric_columns},
              **{n: tf.constant("", tf.string) for n in cfg.categorical_columns}}
    # CsvDataset yields the selected columns in file order.
    selected = sorted(columns.index(name) for name in wanted)
    names = [columns[i] for i in selected]
    data_spec = spec(cfg)

    def read_file(path):
        lines, header_fits = _header(path, names, selected)

        def header_checked(path):
            # Columns are read by their places in the first file's header: a file that has them elsewhere (a
            # column added or moved in later logs) would train on the wrong fields, or stop on a field of the
            # wrong type naming no file. Never skipped: it is no bad row.
            fits = tf.debugging.Assert(header_fits, [tf.strings.join([
                record_files.MARKER, path, " record 0: its header does not have the columns this run reads where "
                f"{files[0]} has them ({', '.join(f'{n!r} at {i + 1}' for n, i in zip(names, selected))}): give "
                "every file one header, or convert the files"])])
            with tf.control_dependencies([fits]):
                return tf.identity(path)

        # An empty file holds no rows (CsvDataset would fail on it, naming no file).
        rows = tf.data.Dataset.from_tensors(path).map(header_checked).filter(lambda _: lines > 0).flat_map(
            lambda path: tf.data.experimental.CsvDataset(path, [wanted[n] for n in names], header=True,
                                                         select_cols=selected))
        blocks = rows.batch(record_files.BLOCK).enumerate()
        return blocks.map(lambda block_number, columns: (path, block_number, columns))

    def check_labels(path, block_number, columns):
        indices = record_files.block_indices(block_number, tf.size(columns[0]), first=1)  # row 1: after the header
        if not by_file:  # every shard.count-th row of each file
            mine = tf.equal((indices - 1) % shard.count, shard.index)
            indices, columns = tf.boolean_mask(indices, mine), [tf.boolean_mask(c, mine) for c in columns]
        row = dict(zip(names, columns))
        label = row.pop(cfg.label_column)
        bad, problems = record_files.name_bad_records(path, indices, [
            (tf.equal(label, EMPTY_LABEL), f"'{cfg.label_column}' is empty"),
            record_files.label_failure(label, cfg.label_column, data_spec.num_classes)])
        return record_files.resolve(bad, problems, (row, label), cfg.skip_bad_records)

    by_file = len(files) >= shard.count
    blocks = record_files.read_files(files[shard.index::shard.count] if by_file else files, PARALLEL_FILES, read_file,
                                     check_labels, cfg.skip_bad_records, feed=shard.feed)
    return record_files.settle(blocks, cfg.skip_bad_records)


records = packing.unbatched(blocks)


def _header(path, names: list[str], places: list[int]) -> tuple[tf.Tensor, tf.Tensor]:
    """(0 for an empty file, else 1; whether its header names `names` at `places`, or it is empty), the
    header parsed as header() does: fields split at commas, a field's surrounding quotes dropped."""
    lines, line = tf.data.TextLineDataset(path).take(1).reduce(
        (tf.constant(0), tf.constant("")), lambda _, first: (tf.constant(1), first))
    fields = tf.strings.regex_replace(tf.strings.split(tf.strings.regex_replace(line, r"\r$", ""), ","),
                                      '^"(.*)"$', r"\1")
    padded = tf.concat([fields, tf.fill([max(places) + 1], "")], 0)
    return lines, tf.logical_or(tf.equal(lines, 0), tf.reduce_all(tf.equal(tf.gather(padded, places), names)))


def shard_description(cfg, split: str, shard) -> str:
    files = sorted(tf.io.gfile.glob(pattern(cfg.split_dir(split), split)))
    return record_files.file_shard_description(files, shard, unit="rows")
