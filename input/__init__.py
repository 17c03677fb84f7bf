"""Data sources by name, and the pipeline that turns one worker's shard into batches.

A source is a module with check(cfg) -> problem or None, records(cfg, split, shard) -> unbatched
(uint8 image, int64 label) of that shard only, IMAGE_SHAPE and NUM_CLASSES. Adding one is one new
file and one line in DATASETS.
"""

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from input import synthetic, tfrecord, tuning
from input.records import bad_record_message  # noqa: F401  (the trainer reports input errors)

DATASETS = {
    "synthetic": synthetic,
    "tfrecord": tfrecord,
}
SHUFFLE_BUFFER = 10000


@dataclasses.dataclass(frozen=True)
class DataConfig:
    name: str = "synthetic"
    data_dir: str | None = None
    synthetic_examples: int = 20000
    seed: int = 42
    skip_bad_records: bool = False


class Shard(NamedTuple):
    """This worker's part of the data: every count-th example, starting at index."""

    index: int
    count: int


def batches(cfg: DataConfig, shard: Shard, batch_size: int, split: str = "train",
            repeat: bool = True) -> tf.data.Dataset:
    """(float images in [0, 1], int64 labels) batches of this shard, shuffled with a per-shard seed."""
    source = DATASETS[cfg.name]
    dataset = source.records(cfg, split, shard).cache()
    if split == "train":
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=cfg.seed + shard.index,
                                  reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=repeat)
    dataset = dataset.map(lambda image, label: (tf.cast(image, tf.float32) / 255.0, label),
                          num_parallel_calls=tuning.PARALLEL_CALLS)
    return tuning.without_autotune(dataset.prefetch(tuning.PREFETCH_BATCHES))


def spec(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    source = DATASETS[cfg.name]
    return source.IMAGE_SHAPE, source.NUM_CLASSES
