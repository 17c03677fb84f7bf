"""The plain values the data sources share: what to read, a worker's shard, what an example holds."""

import dataclasses
from typing import NamedTuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DataConfig:
    name: str = "synthetic"
    data_dir: str | None = None
    eval_data_dir: str | None = None  # default: the held-out split of data_dir
    synthetic_examples: int = 60000
    seed: int = 42
    # Training examples a worker shuffles among: the randomness of its batches, and (--input_queue)
    # the most examples a file can have trained past its trained prefix.
    shuffle_buffer: int = 10000
    skip_bad_records: bool = False
    cache: str | None = None  # "none", "memory" or a directory; None: the source's default
    # Tabular data (csv, and tfrecord written from it): the columns to read.
    label_column: str = "label"
    numeric_columns: tuple[str, ...] = ()
    categorical_columns: tuple[str, ...] = ()
    # Categorical columns of any number of values per field, each "NAME:SEPARATOR" (--multi_valued_columns).
    multi_valued_columns: tuple[str, ...] = ()
    num_classes: int = 2
    # csv and criteo: what an empty numeric field reads as.
    numeric_default: float = 0.0
    # --input_queue: the training files handed out by a work queue on ps 0 (input/work_queue.py).
    input_queue: bool = False
    input_queue_by_default: bool = False  # chosen without --input_queue: a checkpoint saved without it wins
    input_queue_lease_secs: int = 120
    input_queue_audit: bool = False  # each worker writes the (epoch, file, record) of each example it trains
    # The held-out evaluation also reports the group AUC over this feature's values (training/gauc.py).
    group_column: str | None = None

    def split_dir(self, split: str) -> str | None:
        return self.eval_data_dir if split == "eval" and self.eval_data_dir else self.data_dir

    def separators(self) -> dict[str, str]:
        """{each multi-valued column: the separator between its values}."""
        return dict(entry.split(":", 1) for entry in self.multi_valued_columns)


class DataSpec(NamedTuple):
    features: dict[str, tf.TensorSpec]  # one example's raw features, by name
    num_classes: int
    # {a string feature that holds any number of values, its field split at the separator: the separator}
    separators: dict[str, str] = {}


class Shard(NamedTuple):
    """This worker's part of the data: every count-th example, starting at index."""

    index: int
    count: int
    feed: object = None  # --input_queue: the work queue's feed (input/work_queue.py) instead; count is 1


def tabular_spec(data_cfg: DataConfig) -> DataSpec:
    features = {name: tf.TensorSpec([], tf.float32, name) for name in data_cfg.numeric_columns}
    separators = data_cfg.separators()
    features.update({name: tf.TensorSpec([], tf.string, name) for name in (*data_cfg.categorical_columns, *separators)})
    return DataSpec(features, data_cfg.num_classes, separators)


def generated_shard_description(data_cfg: DataConfig, split: str, shard: Shard, eval_examples: int) -> str:
    """Which of a generated dataset's examples a worker makes, in the words of the startup line."""
    count = data_cfg.synthetic_examples if split == "train" else eval_examples
    every = f"examples {shard.index}, {shard.index + shard.count}, ... of" if shard.count > 1 else "all"
    return f"{every} {count} generated from seed {data_cfg.seed}"
