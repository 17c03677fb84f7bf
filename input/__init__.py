"""Data sources by name, and the pipeline that turns one worker's shard into batches.

A source is a module that has what `Source` names. Adding one is one new file and one line in DATASETS.

File sources stream: a worker holds the shuffle buffer, the blocks being read and the prefetched
batches, never its shard. --cache=memory keeps every example a worker has read (its whole shard,
decoded, after the first epoch); --cache=<directory> writes it there instead (about the size of
the data, per worker) and rereads it from the second epoch on.
"""

import os
from collections.abc import Callable
from typing import Protocol

import tensorflow as tf

from ps_trainer.input import clicks, criteo, csv_files, idx, packing, synthetic, tfrecord, tuning, zipf_clicks
from ps_trainer.input.records import bad_record_message  # noqa: F401  (the trainer reports input errors)
from ps_trainer.input.specs import DataConfig, DataSpec, Shard  # noqa: F401



class Source(Protocol):
    """What a data source module has (DATASETS' values)."""

    KIND: str  # "generated" (made from the seed: cached in memory by default) or "files" (streamed)
    # The columns it can read as multi-valued (--multi_valued_columns), or None: any column of its files.
    MULTI_VALUED: tuple[str, ...] | None

    def check(self, data_cfg: DataConfig) -> str | None:
        """A problem to report, or None."""

    def spec(self, data_cfg: DataConfig) -> DataSpec:
        """The raw features of one example (what a served model takes) and the number of classes."""

    def blocks(self, data_cfg: DataConfig, split: str, shard: Shard) -> tf.data.Dataset:
        """That shard's records in blocks, each component with a leading dimension."""

    def records(self, data_cfg: DataConfig, split: str, shard: Shard) -> tf.data.Dataset:
        """That shard's records one at a time, (features dict, int64 label): packing.unbatched(blocks)."""

    def shard_description(self, data_cfg: DataConfig, split: str, shard: Shard) -> str:
        """Which records that shard is, in words."""


class FileSource(Source, Protocol):
    """What a source of KIND "files" has besides."""

    # (data_cfg, split) -> the split's files, which the input queue hands out one at a time; None for a format
    # whose records are not cut by file (MNIST's IDX: one file of images, one of labels).
    files: Callable[[DataConfig, str], list[str]] | None

    def found_in(self, data_dir: str) -> bool:
        """Whether the directory holds this format's training files."""


DATASETS: dict[str, Source] = {
    "synthetic": synthetic,
    "clicks": clicks,
    "tfrecord": tfrecord,
    "csv": csv_files,
    "criteo": criteo,
    "idx": idx,
    "zipf_clicks": zipf_clicks,
}
NO_CACHE, MEMORY = "none", "memory"
GENERATED = "generated"


def spec(data_cfg: DataConfig) -> DataSpec:
    return DATASETS[data_cfg.name].spec(data_cfg)


def is_generated(name: str) -> bool:
    return DATASETS[name].KIND == GENERATED


def lists_files(name: str) -> bool:
    """Whether the source lists its files (FileSource.files), which the input queue hands out one at a time."""
    return not is_generated(name) and DATASETS[name].files is not None


def formats_in(data_dir: str) -> list[str]:
    """The file formats whose training files the directory holds."""
    return [name for name, source in DATASETS.items() if not is_generated(name) and source.found_in(data_dir)]


def cache_mode(data_cfg: DataConfig) -> str:
    return data_cfg.cache or (MEMORY if is_generated(data_cfg.name) else NO_CACHE)


def describe(data_cfg: DataConfig, shard: Shard, split: str = "train") -> str:
    """What a worker reads, for its startup line."""
    where = "" if is_generated(data_cfg.name) else f" from {data_cfg.split_dir(split)}"
    if data_cfg.input_queue and split == "train":
        count = len(DATASETS[data_cfg.name].files(data_cfg, split))
        return f"dataset {data_cfg.name}{where}, {split} split: {count} file(s) handed out by the input queue on ps 0"
    described = DATASETS[data_cfg.name].shard_description(data_cfg, split, shard)
    return (f"dataset {data_cfg.name}{where}, {split} split: {described}"
            f" (worker shard {shard.index} of {shard.count}); cache: {cache_mode(data_cfg)}")


@tuning.pipeline
def batches(data_cfg: DataConfig, shard: Shard, batch_size: int, split: str = "train",
            repeat: bool = True) -> tf.data.Dataset:
    """(features, int64 labels) batches of this shard, shuffled with a per-shard seed; with a feed
    (--input_queue), queued_batches()."""
    if shard.feed is not None:
        return queued_batches(data_cfg, shard, batch_size)

    def batch(records):
        dataset = _cached(records, cache_mode(data_cfg), split, shard)
        if split == "train":
            dataset = dataset.shuffle(data_cfg.shuffle_buffer, seed=data_cfg.seed + shard.index,
                                      reshuffle_each_iteration=True)
        if repeat:
            dataset = dataset.repeat()
        return dataset.batch(batch_size, drop_remainder=repeat)

    # Packed a block at a time, which costs less than an example at a time (input/packing.py).
    blocks = DATASETS[data_cfg.name].blocks(data_cfg, split, shard)
    return packing.batched(blocks, batch, in_blocks=True).prefetch(tuning.PREFETCH_BATCHES)


@tuning.pipeline
def queued_batches(data_cfg: DataConfig, shard: Shard, batch_size: int) -> tf.data.Dataset:
    """--input_queue: (features, int64 labels, int64 file keys, int64 ordinals of the examples in their
    files) batches of the files the work queue
    (input/work_queue.py) hands this worker, in passes. A pass reads files while there are files to
    take, then ends: its shuffle buffer drains and its last batch, short, is trained, so that the files
    it read get finished before the next pass waits for a peer's files to come free (the last ones of
    the run, or a dead worker's). Nothing is cached: each epoch is read from the files."""
    source, feed = DATASETS[data_cfg.name], shard.feed

    def one_pass(_):
        batches = packing.batched(source.blocks(data_cfg, "train", shard), lambda records: records.shuffle(
            data_cfg.shuffle_buffer, seed=data_cfg.seed + feed.queue.worker).batch(batch_size), in_blocks=True)
        if not feed.empty_batches:
            return batches
        # Sync: a pass that took no file still gives the round this worker's share, an empty batch.
        empty = tf.data.Dataset.from_tensors(tf.nest.map_structure(_empty, batches.element_spec))
        return batches.concatenate(empty.filter(
            lambda *_: tf.reshape(tf.py_function(feed.took_nothing, [], tf.bool), [])))

    passes = tf.data.Dataset.from_generator(feed.passes, output_signature=tf.TensorSpec([], tf.int64))
    return passes.flat_map(one_pass).prefetch(tuning.PREFETCH_BATCHES)


def _empty(spec: tf.TensorSpec) -> tf.Tensor:
    """A batch of no examples of a batched dataset's element."""
    return tf.zeros([0, *[0 if size is None else size for size in spec.shape[1:]]], spec.dtype)


def _cached(dataset: tf.data.Dataset, mode: str, split: str, shard: Shard) -> tf.data.Dataset:
    if mode == MEMORY:
        return dataset.cache()
    # A directory caches the training split only: the held-out split is read by the chief's final
    # evaluation and by an evaluator process at once, and often only in part.
    if mode == NO_CACHE or split != "train":
        return dataset
    # "packed": its examples as input/packing.py stacks them; a cache of unpacked examples (an earlier
    # release's) holds other tensors, and TensorFlow would refuse it.
    prefix = os.path.join(mode, f"{split}-packed-shard-{shard.index}-of-{shard.count}")
    tf.io.gfile.makedirs(mode)
    # A cache written by a process that died keeps its lock file, and TensorFlow then refuses the
    # prefix. A training shard has one reader, this worker: the lock is its own predecessor's.
    for stale in tf.io.gfile.glob(prefix + "*.lockfile"):
        tf.io.gfile.remove(stale)
    return dataset.cache(prefix)
