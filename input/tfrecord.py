"""TFRecord files of tf.train.Example with an 'image' (raw uint8 bytes, 28x28x1) and a 'label' (int64).

--data_dir holds train-*.tfrecord* and eval-*.tfrecord* (scripts/write_tfrecords.py writes them).
Workers split the files between them when there are at least as many files as workers, and split
the records otherwise.
"""

import os

import tensorflow as tf

from input import synthetic, tuning

IMAGE_SHAPE = synthetic.IMAGE_SHAPE
NUM_CLASSES = synthetic.NUM_CLASSES
FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def pattern(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}-*.tfrecord*")


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


def parse(serialized):
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), IMAGE_SHAPE)
    return image, parsed["label"]


def records(cfg, split: str, shard) -> tf.data.Dataset:
    files = sorted(tf.io.gfile.glob(pattern(cfg.data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no {split} files match {pattern(cfg.data_dir, split)}")
    if len(files) >= shard.count:
        dataset = tf.data.TFRecordDataset(files[shard.index::shard.count])
    else:
        dataset = tf.data.TFRecordDataset(files).shard(shard.count, shard.index)
    return dataset.map(parse, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)


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
