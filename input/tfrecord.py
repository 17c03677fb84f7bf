"""TFRecord files of tf.train.Example with an 'image' (raw uint8 bytes, 28x28x1) and a 'label' (int64).

--data_dir holds train-*.tfrecord and eval-*.tfrecord (scripts/write_tfrecords.py writes them).
Workers split the files between them when there are at least as many files as workers, and split
the records otherwise. A record that is unreadable, lacks a feature, has an image of the wrong
size or a label out of range stops training with its file and index, or with --skip_bad_records
is dropped and logged.
"""

import os

import tensorflow as tf

from input import records as record_files
from input import synthetic, tuning

IMAGE_SHAPE = synthetic.IMAGE_SHAPE
NUM_CLASSES = synthetic.NUM_CLASSES
IMAGE_BYTES = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
# Variable-length, so that a missing or repeated feature is reported as the record's problem
# rather than failing the parse with no record named.
FEATURES = {
    "image": tf.io.VarLenFeature(tf.string),
    "label": tf.io.VarLenFeature(tf.int64),
}
PARALLEL_FILES = 4


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}-*.tfrecord")


def check(cfg):
    if not cfg.data_dir:
        return "--dataset=tfrecord needs --data_dir: a directory of train-*.tfrecord files."
    if not tf.io.gfile.glob(pattern(cfg.data_dir, "train")):
        return (f"--data_dir={cfg.data_dir} holds no training files "
                f"(nothing matches {pattern(cfg.data_dir, 'train')}).")
    return None


def example_proto(image, label) -> bytes:
    """One serialized tf.train.Example in this format, from a uint8 array and an int label."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def parse_checked(path, index, serialized, problem):
    """(path, index, problem, image, label): problem names what is wrong with the record, or is ""."""
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    images, labels = parsed["image"].values, parsed["label"].values
    image = tf.concat([images, [""]], 0)[0]
    label = tf.concat([labels, [0]], 0)[0]
    image_size = tf.strings.length(image)
    label_text = tf.strings.as_string(label)
    checks = [  # the first that applies is reported
        (tf.not_equal(problem, ""), problem),
        (tf.not_equal(tf.size(images), 1),
         tf.strings.join(["needs one 'image' bytes feature, has ", tf.strings.as_string(tf.size(images))])),
        (tf.not_equal(tf.size(labels), 1),
         tf.strings.join(["needs one int64 'label' feature, has ", tf.strings.as_string(tf.size(labels))])),
        (tf.not_equal(image_size, IMAGE_BYTES),
         tf.strings.join(["'image' has ", tf.strings.as_string(image_size), f" bytes, expected "
                          f"{IMAGE_BYTES} ({'x'.join(map(str, IMAGE_SHAPE))} uint8)"])),
        (tf.logical_or(label < 0, label >= NUM_CLASSES),
         tf.strings.join(["'label' is ", label_text, f", outside 0..{NUM_CLASSES - 1}"])),
    ]
    found = tf.constant("")
    for failed, message in reversed(checks):
        found = tf.where(failed, message, found)
    good = tf.equal(found, "")
    image = tf.where(good, image, tf.constant(b"\0" * IMAGE_BYTES))
    image = tf.reshape(tf.io.decode_raw(image, tf.uint8), IMAGE_SHAPE)
    return path, index, found, image, tf.where(good, label, tf.constant(0, tf.int64))


def records(cfg, split: str, shard) -> tf.data.Dataset:
    files = sorted(tf.io.gfile.glob(pattern(cfg.data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(cfg.data_dir, split)}")
    by_file = len(files) >= shard.count
    dataset = record_files.read_files(files[shard.index::shard.count] if by_file else files, PARALLEL_FILES)
    if not by_file:
        dataset = dataset.shard(shard.count, shard.index)
    dataset = dataset.map(parse_checked, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)
    return record_files.check_or_skip(dataset, cfg.skip_bad_records)


def write(records, data_dir: str, split: str, num_files: int) -> list[str]:
    """Writes (uint8 image, label) pairs round-robin into num_files files of `split`; returns the paths.

    Each file is written under a temporary name and renamed when complete, so a reader never sees
    a half-written file under a name it would match.
    """
    tf.io.gfile.makedirs(data_dir)
    paths = [os.path.join(data_dir, f"{split}-{i:05d}-of-{num_files:05d}.tfrecord")
             for i in range(num_files)]
    writers = [tf.io.TFRecordWriter(path + ".incomplete") for path in paths]
    try:
        for i, (image, label) in enumerate(records):
            writers[i % num_files].write(example_proto(image, label))
    finally:
        for writer in writers:
            writer.close()
    for path in paths:
        tf.io.gfile.rename(path + ".incomplete", path, overwrite=True)
    return paths
