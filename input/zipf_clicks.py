"""Criteo-shaped click logs, generated from --seed at any --synthetic_examples: for benchmarks of
embedding tables.

Each example has Criteo's columns (label, integers I1..I13, categoricals C1..C26). Column Ck draws
its ID from CARDINALITIES[k] values (from 3 up to a million), by Zipf's law (the r-th most frequent
ID is drawn about r^-1.1 as often), as IDs in real logs are: a few are everywhere, most are rare.
Every ID has a hidden affinity, and the click probability rises with the sum of the example's
affinities, so a model that tells IDs apart (a row per ID) beats one whose IDs share rows (a small
hashed table). IDs are digit strings, a different set per column. Example i is a
pure function of (seed, i): each worker makes exactly its own shard, with no file.
"""

import numpy as np
import tensorflow as tf

from ps_trainer.input import criteo, packing, tuning
from ps_trainer.input.specs import generated_shard_description

KIND = "generated"
EVAL_EXAMPLES = 20000
# Values per categorical column: 3 up to 1,000,000, evenly on a log scale.
CARDINALITIES = tuple(int(round(3 * (1e6 / 3) ** (i / 25))) for i in range(26))
ZIPF_EXPONENT = 1.1
AFFINITY_SCALE = 0.5  # of each column's affinity: 26 of them, so the score's spread is about 2.5
BLOCK = 1024  # examples made by one call


def check(data_cfg):
    return None


def spec(data_cfg):
    return criteo.spec(data_cfg)


def _zipf_ranks(uniform, cardinality):
    """Ranks 0..cardinality-1 by the inverse CDF of a bounded power law with ZIPF_EXPONENT."""
    one_minus_s = 1.0 - ZIPF_EXPONENT
    top = (cardinality + 1.0) ** one_minus_s  # x in [1, cardinality + 1), rank floor(x) - 1
    ranks = tf.floor(tf.pow(1.0 + uniform * (top - 1.0), 1.0 / one_minus_s)) - 1.0
    return tf.minimum(tf.cast(ranks, tf.int64), tf.cast(cardinality, tf.int64) - 1)


def _ids_and_affinities(uniform):
    """[n, 26] ID strings and their N(0, 1) affinities, from [n, 26] uniforms."""
    cardinality = tf.constant(CARDINALITIES, tf.float64)
    ranks = _zipf_ranks(tf.cast(uniform, tf.float64), cardinality)
    # Scrambled so that a column's IDs look like hashes: an odd multiplier is a bijection mod 2^32.
    column = tf.range(26, dtype=tf.int64)
    hashed = (ranks * 2654435761 + column * 40503 + 12345) % (1 << 32)
    ids = tf.strings.as_string(hashed, width=10, fill="0")
    columns = tf.broadcast_to(tf.strings.as_string(column), tf.shape(ids))
    bucket = tf.cast(tf.strings.to_hash_bucket_fast(tf.strings.join([columns, ids], "/"), 1 << 24), tf.float32)
    affinities = tf.math.sqrt(2.0) * tf.math.erfinv((bucket + 0.5) / float(1 << 24) * 2.0 - 1.0)
    return ids, affinities


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    first = 0 if split == "train" else data_cfg.synthetic_examples
    count = data_cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    seed = data_cfg.seed

    def make(indices):
        draws = tf.map_fn(lambda index: tf.random.stateless_uniform([26 + 13 + 1], [seed, index]), indices,
                          fn_output_signature=tf.float32)
        ids, affinities = _ids_and_affinities(draws[:, :26])
        counts = tf.floor(tf.exp(draws[:, 26:39] * 6.0) - 1.0)  # integer features, heavy tailed
        score = AFFINITY_SCALE * tf.reduce_sum(affinities, axis=1) - 1.2
        labels = tf.cast(draws[:, 39] < tf.sigmoid(score), tf.int64)
        features = {name: counts[:, i] for i, name in enumerate(criteo.INTEGER)}
        features.update({name: ids[:, i] for i, name in enumerate(criteo.CATEGORICAL)})
        return features, labels

    indices = tf.data.Dataset.range(first, first + count).shard(shard.count, shard.index)
    return indices.batch(BLOCK).map(make, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    return generated_shard_description(data_cfg, split, shard, EVAL_EXAMPLES)


def expected_distinct_ids(examples: int) -> int:
    """About how many distinct IDs `examples` rows hold over all columns (for sizing tables)."""
    total = 0
    for cardinality in CARDINALITIES:
        ranks = np.arange(1, cardinality + 1, dtype=np.float64)
        p = ranks ** -ZIPF_EXPONENT
        p /= p.sum()
        total += float(np.sum(1.0 - np.exp(-examples * p)))
    return int(total)
