"""Data sources by name, and the pipeline that turns one worker's shard into batches.

A source is a module with
  check(cfg) -> a problem to report, or None;
  spec(cfg) -> DataSpec: the raw features of one example (what a served model takes) and the
               number of classes;
  records(cfg, split, shard) -> unbatched (features dict, int64 label) of that shard only.
Adding one is one new file and one line in DATASETS.
"""

import tensorflow as tf

from input import clicks, csv_files, idx, synthetic, tfrecord, tuning
from input.specs import DataConfig, DataSpec, Shard  # noqa: F401
from input.records import bad_record_message  # noqa: F401  (the trainer reports input errors)

DATASETS = {
    "synthetic": synthetic,
    "clicks": clicks,
    "tfrecord": tfrecord,
    "csv": csv_files,
    "idx": idx,
}
SHUFFLE_BUFFER = 10000


def spec(cfg: DataConfig) -> DataSpec:
    return DATASETS[cfg.name].spec(cfg)


def batches(cfg: DataConfig, shard: Shard, batch_size: int, split: str = "train",
            repeat: bool = True) -> tf.data.Dataset:
    """(features, int64 labels) batches of this shard, shuffled with a per-shard seed."""
    dataset = DATASETS[cfg.name].records(cfg, split, shard).cache()
    if split == "train":
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=cfg.seed + shard.index,
                                  reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=repeat)
    return tuning.without_autotune(dataset.prefetch(tuning.PREFETCH_BATCHES))
