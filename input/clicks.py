"""The embedded default for the wide-and-deep model: click logs, generated from --seed.

Each example is a user, an item and the item's category (strings, as they come from a log), an
hour of the day and a price; the label says whether the user clicked. Every user, item and
category has a hidden affinity drawn from the seed, and the click probability rises with their
sum, so the model has something to learn from the ids themselves. Example i is a pure function of
(seed, i), so each worker produces exactly its own shard with no download.
"""

import tensorflow as tf

from ps_trainer.input import packing, tuning
from ps_trainer.input.specs import DataSpec, generated_shard_description

USERS, ITEMS, CATEGORIES = 5000, 2000, 50
EVAL_EXAMPLES = 5000
BLOCK = 1024  # examples made by one call
NUMERIC = ("hour", "price")
CATEGORICAL = ("user", "item", "category")


KIND = "generated"
MULTI_VALUED = ()  # no multi-valued columns


def check(data_cfg):
    return None


def spec(data_cfg):
    features = {name: tf.TensorSpec([], tf.float32, name) for name in NUMERIC}
    features.update({name: tf.TensorSpec([], tf.string, name) for name in CATEGORICAL})
    return DataSpec(features, 2)


def _affinity(seed, kind, ids):
    """A fixed N(0, 1) per id, the same in every process: each id's own draw."""
    return tf.map_fn(lambda id_: tf.random.stateless_normal([], [seed * 7 + kind, id_]), ids,
                     fn_output_signature=tf.float32)


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    first = 0 if split == "train" else data_cfg.synthetic_examples
    count = data_cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    seed = data_cfg.seed

    def make(indices):
        # Each example's draws from its own index, as made one at a time (the same examples).
        draws = tf.map_fn(lambda index: tf.random.stateless_uniform([5], [seed, index]), indices,
                          fn_output_signature=tf.float32)
        user = tf.cast(draws[:, 0] ** 2 * USERS, tf.int64)  # a few users are much more active
        item = tf.cast(draws[:, 1] * ITEMS, tf.int64)
        category = item % CATEGORIES
        hour = tf.floor(draws[:, 2] * 24)
        price = tf.exp(draws[:, 3] * 4.0)
        score = (_affinity(seed, 1, user) + _affinity(seed, 2, item) + _affinity(seed, 3, category)
                 + 0.5 * tf.cos(hour / 24 * 6.283) - 0.3 * tf.math.log(price) + 0.3)
        label = tf.cast(draws[:, 4] < tf.sigmoid(score), tf.int64)
        features = {
            "hour": hour,
            "price": price,
            "user": tf.strings.join(["u", tf.strings.as_string(user)]),
            "item": tf.strings.join(["i", tf.strings.as_string(item)]),
            "category": tf.strings.join(["c", tf.strings.as_string(category)]),
        }
        return features, label

    indices = tf.data.Dataset.range(first, first + count).shard(shard.count, shard.index)
    return indices.batch(BLOCK).map(make, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    return generated_shard_description(data_cfg, split, shard, EVAL_EXAMPLES)
