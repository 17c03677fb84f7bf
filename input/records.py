"""Reading files in blocks, so that every bad record is named by its file and index at tf.data speed.

A file source reads each file as blocks of up to BLOCK records and checks, parses and decodes a
whole block at once (batched ops, no per-record function), several blocks in parallel. resolve()
then, in the same step, fails the input pipeline on the block's first bad record with a message
that bad_record_message() finds in the error TensorFlow raises, or (skip) drops the bad records,
keeping one description each ('<file> record <n>: <problem>'); settle() logs those with a running
count for this worker and passes on blocks of the good values. Nothing but the
shuffle buffer, the blocks in flight and the prefetched batches is held in memory.

TFRecord files end early without an error when they are cut inside a record's header, and a
corrupt record ends its file under ignore_errors(): every file's blocks count the bytes they read,
and a last, empty block compares that count with the file's size, naming the first record lost.
"""

import os
import re
import sys
from collections.abc import Callable

import tensorflow as tf

from ps_trainer.input import tuning

MARKER = "BadRecord: "
BLOCK = 1024
# Every record costs its data plus a length (8 bytes) and two CRCs (4 bytes each).
RECORD_OVERHEAD_BYTES = 16
_MESSAGE = re.compile(re.escape(MARKER) + r"(.*?)\]?$", re.MULTILINE)
# TensorFlow's own parse errors name the record by the example_names given to parse_example.
_PARSE_ERROR = re.compile(r"Name: (.*? record \d+), Key: (.*?), Index: \d+\.\s+(.*?)(?: \[Op:.*)?$", re.MULTILINE)


def name_bad_records(path, indices, failures: list[tuple[tf.Tensor, Callable | str]]) -> tuple[tf.Tensor, tf.Tensor]:
    """(bad [n] bool, descriptions [k] of the bad records) from (failed [n] bool, message) pairs, a
    message being a string or a function giving [n] strings; a record's first failure is its problem.
    The strings are built only for a block that has a bad record."""
    bad = tf.reduce_any(tf.stack([failed for failed, _ in failures]), axis=0)

    def build():
        found = tf.fill(tf.shape(bad), "")
        for failed, message in reversed(failures):
            found = tf.where(failed, message() if callable(message) else message, found)
        where = tf.boolean_mask(indices, bad)
        return tf.strings.join([path, " record ", tf.strings.as_string(where), ": ", tf.boolean_mask(found, bad)])

    return bad, tf.cond(tf.reduce_any(bad), build, lambda: tf.constant([], tf.string))


def label_failure(labels, label_name: str, num_classes: int) -> tuple[tf.Tensor, Callable]:
    """(failed [n], message) for labels outside 0..num_classes-1, for name_bad_records()."""
    return (tf.logical_or(labels < 0, labels >= num_classes), lambda: tf.strings.join(
        [f"'{label_name}' is ", tf.strings.as_string(labels), f", outside 0..{num_classes - 1}"]))


def interleave(paths: list[str], parallel_files: int, read_file: Callable, *per_file) -> tf.data.Dataset:
    """read_file(path, *per_file values) over the files, parallel_files at a time, in parallel."""
    files = tf.data.Dataset.from_tensor_slices((paths, *per_file))
    cycle = max(1, min(parallel_files, len(paths)))
    return files.interleave(read_file, cycle_length=cycle, num_parallel_calls=cycle, deterministic=True)


def read_files(paths: list[str], parallel_files: int, read_file: Callable, check: Callable, skip: bool,
               *per_file, feed=None) -> tf.data.Dataset:
    """Resolved blocks (see resolve()): check(*block) over the blocks of read_file(path, *per_file values),
    parallel_files files at a time. With a feed (input/work_queue.py, --input_queue), the files are the
    ones the work queue hands this worker, each block's values tagged with its file's key."""
    if feed is None:
        blocks = interleave(paths, parallel_files, read_file, *per_file)
        return blocks.map(check, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)
    paths_by_index = tf.constant(paths)

    def read_item(key, index, generation, start, ahead):
        blocks = read_file(tf.gather(paths_by_index, index), *[tf.gather(values, index) for values in per_file])
        blocks = blocks.map(check, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)
        return feed.counted(blocks, key, generation, skip, start, ahead)

    items = tf.data.Dataset.from_generator(feed.items, output_signature=(
        *(tf.TensorSpec([], tf.int64),) * 4, tf.TensorSpec([None], tf.int64)))
    cycle = max(1, min(parallel_files, len(paths)))
    return items.interleave(read_item, cycle_length=cycle, num_parallel_calls=cycle, deterministic=False)


def compression(path: tf.Tensor) -> tf.Tensor:
    """TextLineDataset's compression_type for a file: 'GZIP' for a name ending in .gz
    (click logs are often kept gzipped, as Criteo publishes its days), '' otherwise."""
    return tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")


def gzip_refusal(paths: list[str]) -> str | None:
    """A startup check's line for the first file named *.gz that is not gzip data (its first two bytes are
    not gzip's), else None: read as gzip it would stop training on "incorrect header check", naming no file."""
    for path in paths:
        if path.endswith(".gz"):
            with tf.io.gfile.GFile(path, "rb") as f:
                magic = f.read(2)
            if magic and magic != b"\x1f\x8b":
                return (f"{path}: its name ends in .gz, which is read as gzip, but it is not gzip data: rename or "
                        "compress it.")
    return None


def block_indices(block_number, n, first: int = 0, stride: int = 1) -> tf.Tensor:
    """The record indices of the block_number-th block (n records) of a file read from record
    `first` in steps of `stride`, for blocks made by Dataset.batch(BLOCK).enumerate()."""
    return first + (block_number * BLOCK + tf.range(tf.cast(n, tf.int64))) * stride


def resolve(bad, problems, values, skip: bool):
    """A decoded block -> its values (failing on a problem), or with skip (problems, good values)."""
    if not skip:
        first = tf.concat([problems, [""]], 0)[0]
        check = tf.debugging.Assert(tf.equal(tf.size(problems), 0), [tf.strings.join([MARKER, first])])
        with tf.control_dependencies([check]):
            return tf.nest.map_structure(tf.identity, values)
    good = tf.logical_not(bad)
    return problems, tf.nest.map_structure(lambda value: tf.boolean_mask(value, good), values)


def tfrecord_blocks(paths: list[str], parallel_files: int, decode: Callable, skip: bool,
                    keep: Callable | None = None, feed=None):
    """Resolved blocks (see resolve()) of the files' records (with a feed, read_files()'s).

    decode(path, indices [n], serialized [n]) -> (bad [n], problems [k], values [n, ...]), run on
    PARALLEL_CALLS blocks at once; keep(indices) -> [n] bool selects this worker's records of a file
    (None: all of them).
    """
    sizes = tf.constant([tf.io.gfile.stat(path).length for path in paths], tf.int64)

    def read_file(path, size):
        blocks = tf.data.TFRecordDataset(path).ignore_errors().batch(BLOCK)
        end = tf.data.Dataset.from_tensors(tf.constant([], tf.string))  # no real block is empty

        def number(state, block):
            count, consumed = state
            n = tf.size(block, out_type=tf.int64)
            consumed += tf.reduce_sum(tf.cast(tf.strings.length(block), tf.int64)) + RECORD_OVERHEAD_BYTES * n
            lost = tf.logical_and(tf.equal(n, 0), tf.not_equal(consumed, size))
            problem = tf.cond(lost, lambda: tf.strings.join(
                [path, " record ", tf.strings.as_string(count), ": cannot be read past byte ",
                 tf.strings.as_string(consumed), " of ", tf.strings.as_string(size),
                 " (truncated or corrupt): this record and any after it are lost"])[None],
                lambda: tf.constant([], tf.string))
            return (count + n, consumed), (path, count + tf.range(n), block, problem)

        start = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
        return blocks.concatenate(end).scan(start, number)

    def checked(path, indices, block, lost):
        if keep:
            mine = keep(indices)
            indices, block = tf.boolean_mask(indices, mine), tf.boolean_mask(block, mine)
        bad, problems, values = decode(path, indices, block)
        return resolve(bad, tf.concat([problems, lost], 0), values, skip)

    return read_files(paths, parallel_files, read_file, checked, skip, sizes, feed=feed)


def settle(blocks: tf.data.Dataset, skip: bool) -> tf.data.Dataset:
    """Resolved blocks -> blocks of the good values; with skip, each bad record is logged with a
    running count for this worker."""
    if not skip:
        return blocks

    def count_and_log(skipped, block):
        problems, values = block
        k = tf.size(problems, out_type=tf.int64)

        def log():
            counts = tf.strings.as_string(skipped + 1 + tf.range(k))
            lines = tf.strings.join(["skipped bad record ", counts, " (so far, this worker): ", MARKER, problems])
            # One scalar string: tf.print writes it as is (it quotes strings among other values).
            printed = tf.print(tf.strings.reduce_join(lines, separator="\n"), output_stream=sys.stderr)
            with tf.control_dependencies([printed]):
                return tf.identity(k)

        logged = tf.cond(k > 0, log, lambda: tf.constant(0, tf.int64))
        return skipped + logged, values

    return blocks.scan(tf.constant(0, tf.int64), count_and_log)


def file_shard_description(files: list[str], shard, unit: str = "records") -> str:
    """Which records (or rows) of the files a worker reads, in the words of the startup line."""
    if shard.count == 1:
        return f"all {len(files)} file(s)"
    if len(files) >= shard.count:
        mine = files[shard.index::shard.count]
        names = ", ".join(os.path.basename(f) for f in mine[:3]) + (", ..." if len(mine) > 3 else "")
        return f"{len(mine)} of {len(files)} files ({names})"
    return (f"{unit} {shard.index}, {shard.index + shard.count}, ... (one in {shard.count}) of each of "
            f"{len(files)} file(s)")


def bad_record_message(error_message: str) -> str | None:
    """'<file> record <n>: <problem>' from the error of a failed settle() or parse, else None."""
    match = _MESSAGE.search(error_message)
    if match:
        # The assertion prints its data C-escaped.
        message = match.group(1).replace("\\'", "'").replace('\\"', '"')
        return f"bad input record: {message}"
    match = _PARSE_ERROR.search(error_message)
    if match:
        return f"bad input record: {match.group(1)}: feature '{match.group(2)}': {match.group(3)}"
    return None
