"""Reading TFRecord files so that every bad record is named: its file and its index in that file.

Each file is read as (path, index, serialized, problem) elements. A file that cannot be read to its
end (truncated, a failed CRC, an I/O error) ends early; a last element per file compares the bytes
read with the file's size and carries the problem if they differ, naming the first record lost. A
source then checks each parsed record (features present, sizes, ranges) into the same `problem`.

check_or_skip() then either fails the input pipeline on the first problem, with a message that
bad_record_message() finds in the error TensorFlow raises, or drops each bad record, logging it
with a running count.
"""

import re
import sys

import tensorflow as tf

MARKER = "BadRecord: "
END_OF_FILE = -1
# Every record costs its data plus a length (8 bytes) and two CRCs (4 bytes each).
RECORD_OVERHEAD_BYTES = 16
_MESSAGE = re.compile(re.escape(MARKER) + r"(.*?)\]?$", re.MULTILINE)


def read_files(paths: list[str], parallel_files: int) -> tf.data.Dataset:
    """(path, index, serialized, problem) for every record of the files, parallel_files at a time."""
    sizes = [tf.io.gfile.stat(path).length for path in paths]
    files = tf.data.Dataset.from_tensor_slices((paths, tf.constant(sizes, tf.int64)))
    cycle = max(1, min(parallel_files, len(paths)))
    dataset = files.interleave(_read_file, cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                               deterministic=True)
    # Readable files end in a problem-free marker element: drop those.
    return dataset.filter(lambda path, index, serialized, problem: index != END_OF_FILE)


def _read_file(path, size):
    records = tf.data.TFRecordDataset(path).ignore_errors()  # the size check below reports an early end
    numbered = records.map(lambda record: (path, tf.constant(0, tf.int64), record, ""))
    end = tf.data.Dataset.from_tensors((path, tf.constant(END_OF_FILE, tf.int64), tf.constant(""),
                                        tf.constant("")))

    def number(state, element):
        count, consumed = state
        path_, index, record, _ = element
        at_end = tf.equal(index, END_OF_FILE)
        problem = tf.where(
            tf.logical_and(at_end, tf.not_equal(consumed, size)),
            tf.strings.join(["cannot be read past byte ", tf.strings.as_string(consumed), " of ",
                             tf.strings.as_string(size), " (truncated or corrupt): this record and "
                             "any after it are lost"]),
            "")
        # The end marker keeps END_OF_FILE as its index unless it reports a problem, when it
        # takes the index of the first record lost.
        out_index = tf.where(at_end, tf.where(tf.equal(problem, ""), index, count), count)
        record_bytes = tf.cast(tf.strings.length(record), tf.int64) + RECORD_OVERHEAD_BYTES
        return (count + 1, consumed + record_bytes), (path_, out_index, record, problem)

    return numbered.concatenate(end).scan((tf.constant(0, tf.int64), tf.constant(0, tf.int64)), number)


def check_or_skip(dataset: tf.data.Dataset, skip: bool) -> tf.data.Dataset:
    """(path, index, problem, *values) -> values, failing on the first problem or dropping each."""
    if not skip:
        def fail_on_problem(path, index, problem, *values):
            check = tf.debugging.Assert(tf.equal(problem, ""), [_describe(path, index, problem)])
            with tf.control_dependencies([check]):
                return tf.nest.map_structure(tf.identity, values)
        return dataset.map(fail_on_problem)

    def count_and_log(skipped, element):
        path, index, problem = element[:3]
        bad = tf.not_equal(problem, "")
        skipped = skipped + tf.cast(bad, tf.int64)

        def log():
            # One scalar string: tf.print writes it as is (it quotes strings among other values).
            line = tf.strings.join(["skipped bad record ", tf.strings.as_string(skipped),
                                    " (so far, this worker): ", _describe(path, index, problem)])
            printed = tf.print(line, output_stream=sys.stderr)
            with tf.control_dependencies([printed]):
                return tf.constant(True)

        logged = tf.cond(bad, log, lambda: tf.constant(False))
        return skipped, (tf.logical_not(logged), *element[3:])

    dataset = dataset.scan(tf.constant(0, tf.int64), count_and_log)
    return dataset.filter(_is_good).map(_values)


def _is_good(good, *values):
    return good


def _values(good, *values):
    return values


def _describe(path, index, problem):
    return tf.strings.join([MARKER, path, " record ", tf.strings.as_string(index), ": ", problem])


def bad_record_message(error_message: str) -> str | None:
    """'<file> record <n>: <problem>' from the error of a failed check_or_skip pipeline, else None."""
    match = _MESSAGE.search(error_message)
    if not match:
        return None
    # The assertion prints its data C-escaped.
    message = match.group(1).replace("\\'", "'").replace('\\"', '"')
    return f"bad input record: {message}"
