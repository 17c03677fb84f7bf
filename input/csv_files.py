"""CSV files with a header row: train-*.csv and eval-*.csv in --data_dir (eval in --eval_data_dir),
each plain or gzipped (train-*.csv.gz); or tab-separated ones, train-*.tsv[.gz] (one kind per split).

--label_column names the int64 class column; --numeric_columns (read as float) and
--categorical_columns (read as strings) name the features, and --multi_valued_columns those whose field
holds any number of values between separators (read whole, as a string: the model splits it,
model/multi_valued.py). Other columns are ignored. An empty
numeric field reads as --numeric_default (0 unless set), an empty categorical one as "", and an
empty label is a bad record named by its file and row. Workers split
the files between them when there are at least as many files as workers, and the rows otherwise.
Every row is checked as it is read (_parse_block): a bad one is named by its file and row and stops
training, or is skipped with --skip_bad_records. A row is one line: a quoted CSV field may hold commas and
doubled quotes, not a line break; TSV has no quoting (a quote is a field's text).
"""

import csv
import gzip
import io
import os

import tensorflow as tf

from ps_trainer.input import records as record_files
from ps_trainer.input import packing, tuning
from ps_trainer.input.specs import tabular_spec

KIND = "files"
MULTI_VALUED = None  # any of its columns can be multi-valued (--multi_valued_columns)

PARALLEL_FILES = 4


DELIMITERS = {".csv": ",", ".tsv": "\t"}  # by the files' names
_SEPARATED = {",": "comma-separated", "\t": "tab-separated"}
# CSV quotes a field that holds a comma or a quote; TSV has no quoting (a tab never is a field's own),
# and a quote in a log's field (a user agent, a search) is its text.
_QUOTING = {",": True, "\t": False}


def pattern(data_dir: str, split: str) -> str:
    """The files' pattern, as messages show it; _glob also takes .tsv files, and each name with .gz added."""
    return os.path.join(data_dir, f"{split}-*.csv")


def _glob(data_dir: str, split: str) -> list[str]:
    return sorted(path for kind in DELIMITERS for suffix in ("", ".gz")
                  for path in tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*{kind}{suffix}")))


def delimiter(path: str) -> str:
    return DELIMITERS[os.path.splitext(path.removesuffix(".gz"))[1]]


def header(path: str) -> list[str]:
    with tf.io.gfile.GFile(path, "rb") as raw:
        line = (gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw).readline()
    # utf-8-sig: a spreadsheet's byte order mark is no part of the first column's name.
    separator = delimiter(path)
    return next(csv.reader(io.StringIO(line.decode("utf-8-sig")), delimiter=separator,
                           quoting=csv.QUOTE_MINIMAL if _QUOTING[separator] else csv.QUOTE_NONE), [])


def files(data_cfg, split: str) -> list[str]:
    return _glob(data_cfg.split_dir(split), split)


def found_in(data_dir: str) -> bool:
    return bool(_glob(data_dir, "train"))


def check(data_cfg):
    if not data_cfg.data_dir:
        return "--dataset=csv needs --data_dir: a directory of train-*.csv files with a header row."
    if not data_cfg.numeric_columns and not data_cfg.categorical_columns and not data_cfg.multi_valued_columns:
        return ("--dataset=csv needs --numeric_columns, --categorical_columns and/or --multi_valued_columns: the "
                "feature columns.")
    for split in ("train", "eval") if data_cfg.eval_data_dir else ("train",):
        files = _glob(data_cfg.split_dir(split), split)
        if not files:
            wanted = pattern(data_cfg.split_dir(split), split)
            return (f"{data_cfg.split_dir(split)} holds no {split} files (nothing matches {wanted}, {split}-*.tsv, or "
                    "either with .gz added).")
        kinds = {delimiter(path) for path in files}
        if len(kinds) > 1:
            return (f"{data_cfg.split_dir(split)} holds both comma-separated (.csv) and tab-separated (.tsv) "
                    f"{split} files: give one kind.")
        refusal = record_files.gzip_refusal(files)
        if refusal:
            return refusal
        try:
            columns = header(files[0])
        except (OSError, EOFError, UnicodeDecodeError) as err:  # gzip.BadGzipFile is an OSError
            return f"{files[0]}: cannot read its header row: {err}."
        for name in _wanted(data_cfg):
            if name not in columns:
                return f"{files[0]}: no column '{name}' in its header ({', '.join(columns)})."
            if columns.count(name) > 1:
                return f"{files[0]}: column '{name}' is in its header {columns.count(name)} times: which one to read?"
    return None


def spec(data_cfg):
    return tabular_spec(data_cfg)


def _strings(data_cfg) -> tuple[str, ...]:
    """The string features: the categorical columns, and each multi-valued one's whole field."""
    return tuple(dict.fromkeys([*data_cfg.categorical_columns, *data_cfg.separators()]))


def _wanted(data_cfg) -> tuple[str, ...]:
    """The columns a run reads: the label, then the features."""
    return (data_cfg.label_column, *data_cfg.numeric_columns, *_strings(data_cfg))


# A field is quoted whole ("a ""b"", c": quotes inside doubled) or holds no quote; rows are one line each.
_QUOTED = r'"(?:[^"]|"")*"'
_NUMBER = r"\s*[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*"
_INTEGER = r"\s*[-+]?[0-9]+\s*"


def _row(separator: str) -> str:
    """A well-formed row's pattern: fields, each quoted whole or holding no quote, between separators."""
    field = f'(?:{_QUOTED}|[^{separator}"]*)'
    return f"{field}(?:{separator}{field})*"


def _field_counts(lines: tf.Tensor, separator: str) -> tf.Tensor:
    """The fields of each line, a separator inside a quoted field (CSV's) not counted."""
    plain = tf.strings.regex_replace(lines, _QUOTED, "") if _QUOTING[separator] else lines
    return tf.strings.length(plain) - tf.strings.length(tf.strings.regex_replace(plain, separator, "")) + 1


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    data_dir = data_cfg.split_dir(split)
    files = _glob(data_dir, split)
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(data_dir, split)}")
    columns, separator = header(files[0]), delimiter(files[0])  # one kind per split: check()
    wanted = _wanted(data_cfg)
    # Read in file order, by the places of the first file's header; every file's header is checked.
    selected = sorted(columns.index(name) for name in wanted)
    names = [columns[i] for i in selected]
    data_spec = spec(data_cfg)

    def read_file(path):
        header_fits, width = _header(path, names, selected, separator)

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

        rows = tf.data.Dataset.from_tensors(path).map(header_checked).flat_map(
            lambda path: tf.data.TextLineDataset(path, compression_type=record_files.compression(path)).skip(1))
        blocks = rows.batch(record_files.BLOCK).enumerate()
        return blocks.map(lambda block_number, rows: (path, block_number, rows, width))

    def checked(path, block_number, rows, width):
        indices = record_files.block_indices(block_number, tf.size(rows), first=1)  # row 1: after the header
        if not by_file:  # every shard.count-th row of each file
            mine = tf.equal((indices - 1) % shard.count, shard.index)
            indices, rows = tf.boolean_mask(indices, mine), tf.boolean_mask(rows, mine)
        bad, problems, values = _parse_block(path, indices, rows, width, separator, names, selected, data_cfg,
                                             data_spec.num_classes)
        return record_files.resolve(bad, problems, values, data_cfg.skip_bad_records)

    by_file = len(files) >= shard.count
    blocks = record_files.read_files(files[shard.index::shard.count] if by_file else files, PARALLEL_FILES, read_file,
                                     checked, data_cfg.skip_bad_records, feed=shard.feed)
    return record_files.settle(blocks, data_cfg.skip_bad_records)


records = packing.unbatched(blocks)


def _parse_block(path, indices, rows, width, separator, names, selected, data_cfg, num_classes):
    """(bad [n], problems [k], (features, labels)) of a block of rows, for record_files.resolve(). Each row is
    checked before it is read: a row with more or fewer fields than its file's header (a comma missing or
    added shifts every later column onto the wrong name), a quote that does not enclose its whole field, an
    empty or non-integer label, or a word in a numeric column is named by its file and row."""
    quoting = _QUOTING[separator]
    well_formed = tf.strings.regex_full_match(rows, _row(separator)) if quoting else tf.fill(tf.shape(rows), True)
    counts = _field_counts(rows, separator)
    fits = tf.logical_and(well_formed, tf.equal(counts, width))
    # decode_csv fails a whole block on one bad row: a bad row is read as an empty one, and dropped or named.
    safe = tf.where(fits, rows, tf.strings.reduce_join(tf.fill([width - 1], separator)))
    text = dict(zip(names, tf.io.decode_csv(safe, [""] * len(names), field_delim=separator, use_quote_delim=quoting,
                                            select_cols=selected)))
    label_text = text[data_cfg.label_column]
    numeric = tf.stack([text[name] for name in data_cfg.numeric_columns] or [tf.fill(tf.shape(rows), "")], axis=1)
    empty = tf.equal(numeric, "")
    not_number = tf.logical_and(tf.logical_not(empty), tf.logical_not(tf.strings.regex_full_match(numeric, _NUMBER)))
    first_not_number = tf.argmax(tf.cast(not_number, tf.int32), axis=1)
    label_is_integer = tf.strings.regex_full_match(label_text, _INTEGER)
    labels = tf.strings.to_number(tf.where(label_is_integer, label_text, "0"), tf.int64)
    out_of_range, out_of_range_message = record_files.label_failure(labels, data_cfg.label_column, num_classes)
    bad, problems = record_files.name_bad_records(path, indices, [
        (tf.logical_not(well_formed), "a quote in it does not enclose its whole field (a row is one line)"),
        (tf.not_equal(counts, width), lambda: tf.strings.join(
            ["has ", tf.strings.as_string(counts), f" {_SEPARATED[separator]} fields where its header has ",
             tf.strings.as_string(width)])),
        (tf.equal(label_text, ""), f"'{data_cfg.label_column}' is empty"),
        (tf.logical_not(label_is_integer), lambda: tf.strings.join(
            [f"'{data_cfg.label_column}' is '", label_text, "', not an integer"])),
        (tf.logical_and(label_is_integer, out_of_range), out_of_range_message),
        (tf.reduce_any(not_number, axis=1), lambda: tf.strings.join(
            ["'", tf.gather(list(data_cfg.numeric_columns) or [""], first_not_number), "' is '",
             tf.gather(numeric, first_not_number, batch_dims=1), "', not a number"])),
    ])
    values = tf.strings.to_number(tf.where(tf.logical_or(empty, not_number), "0", numeric), tf.float32)
    values = tf.where(empty, tf.constant(data_cfg.numeric_default, tf.float32), values)
    features = {name: values[:, i] for i, name in enumerate(data_cfg.numeric_columns)}
    features.update({name: text[name] for name in _strings(data_cfg)})
    return bad, problems, (features, labels)


def _header(path, names: list[str], places: list[int], separator: str) -> tuple[tf.Tensor, tf.Tensor]:
    """(whether its header names `names` at `places`, or the file is empty; the header's fields), the
    header parsed as header() does: fields split at separators, a CSV field's surrounding quotes dropped."""
    lines, line = tf.data.TextLineDataset(path, compression_type=record_files.compression(path)).take(1).reduce(
        (tf.constant(0, tf.int64), tf.constant("")), lambda _, first: (tf.constant(1, tf.int64), first))
    line = tf.strings.regex_replace(line, "^\ufeff", "")  # the byte order mark header() drops
    fields = tf.strings.split(line, separator)
    if _QUOTING[separator]:
        fields = tf.strings.regex_replace(fields, '^"(.*)"$', r"\1")
    padded = tf.concat([fields, tf.fill([max(places) + 1], "")], 0)
    fits = tf.logical_or(tf.equal(lines, 0), tf.reduce_all(tf.equal(tf.gather(padded, places), names)))
    return fits, _field_counts(line, separator)


def shard_description(data_cfg, split: str, shard) -> str:
    return record_files.file_shard_description(_glob(data_cfg.split_dir(split), split), shard, unit="rows")
