"""Criteo-shaped click logs, generated from --seed at any --synthetic_examples: for benchmarks of
embedding tables.

Each example has Criteo's columns (label, integers I1..I13, categoricals C1..C26). Column Ck draws
its ID from CARDINALITIES[k] values (from 3 up to a million), by Zipf's law (the r-th most frequent
ID is drawn about r^-1.1 as often), as IDs in real logs are: a few are everywhere, most are rare.
Every ID has a hidden affinity, and the click probability rises with the sum of the example's
affinities, so a model that tells IDs apart (a row per ID) beats one whose IDs share rows (a small
hashed table). IDs are digit strings, a different set per column. Example i is a
pure function of (seed, i): each worker makes exactly its own shard, with no file.

With --multi_valued_columns=history (its separator as given, '|' by default), each example also has a
user's history: 0 to MAX_HISTORY items (their count log-uniform: a sixth of users have none, a few have
dozens), drawn by Zipf's law from HISTORY_ITEMS, each with an affinity of its own; the mean of their
affinities adds to the click score.
"""

import numpy as np
import tensorflow as tf

from ps_trainer.input import criteo, packing, tuning
from ps_trainer.input.specs import generated_shard_description

KIND = "generated"
MULTI_VALUED = ("history",)  # --multi_valued_columns=history adds the one it makes
EVAL_EXAMPLES = 20000
# Values per categorical column: 3 up to 1,000,000, evenly on a log scale.
CARDINALITIES = tuple(int(round(3 * (1e6 / 3) ** (i / 25))) for i in range(26))
ZIPF_EXPONENT = 1.1
AFFINITY_SCALE = 0.5  # of each column's affinity: 26 of them, so the score's spread is about 2.5
BLOCK = 1024  # examples made by one call
HISTORY = "history"
MAX_HISTORY = 50
HISTORY_ITEMS = 100000
HISTORY_SCALE = 1.5  # of the mean affinity of an example's history items
# The history's draws come from a stream of their own, [seed, index + HISTORY_STREAM], which leaves the
# other columns' draws as they are without it.
HISTORY_STREAM = 1 << 40


def check(data_cfg):
    return None


def spec(data_cfg):
    data_spec = criteo.spec(data_cfg)
    separators = data_cfg.separators()
    if HISTORY not in separators:
        return data_spec
    features = {**data_spec.features, HISTORY: tf.TensorSpec([], tf.string, HISTORY)}
    return data_spec._replace(features=features, separators={HISTORY: separators[HISTORY]})


def _zipf_ranks(uniform, cardinality):
    """Ranks 0..cardinality-1 by the inverse CDF of a bounded power law with ZIPF_EXPONENT."""
    one_minus_s = 1.0 - ZIPF_EXPONENT
    top = (cardinality + 1.0) ** one_minus_s  # x in [1, cardinality + 1), rank floor(x) - 1
    ranks = tf.floor(tf.pow(1.0 + uniform * (top - 1.0), 1.0 / one_minus_s)) - 1.0
    return tf.minimum(tf.cast(ranks, tf.int64), tf.cast(cardinality, tf.int64) - 1)


def _ids_and_affinities(uniform, cardinalities=CARDINALITIES, column=None):
    """[n, k] ID strings and their N(0, 1) affinities, from [n, k] uniforms: column j's from cardinalities[j]
    values (`column`: the columns' numbers, 0..k-1 unless given)."""
    cardinality = tf.constant(cardinalities, tf.float64)
    ranks = _zipf_ranks(tf.cast(uniform, tf.float64), cardinality)
    # Scrambled so that a column's IDs look like hashes: an odd multiplier is a bijection mod 2^32.
    column = tf.range(len(cardinalities), dtype=tf.int64) if column is None else tf.constant(column, tf.int64)
    hashed = (ranks * 2654435761 + column * 40503 + 12345) % (1 << 32)
    ids = tf.strings.as_string(hashed, width=10, fill="0")
    columns = tf.broadcast_to(tf.strings.as_string(column), tf.shape(ids))
    bucket = tf.cast(tf.strings.to_hash_bucket_fast(tf.strings.join([columns, ids], "/"), 1 << 24), tf.float32)
    affinities = tf.math.sqrt(2.0) * tf.math.erfinv((bucket + 0.5) / float(1 << 24) * 2.0 - 1.0)
    return ids, affinities


def _history(seed, indices, separator: str):
    """([n] history fields, [n] the mean affinity of each one's items, 0 for none)."""
    draws = tf.map_fn(lambda index: tf.random.stateless_uniform([1 + MAX_HISTORY], [seed, index + HISTORY_STREAM]),
                      indices, fn_output_signature=tf.float32)
    lengths = tf.cast(tf.floor(tf.exp(draws[:, 0] * float(np.log(MAX_HISTORY + 1)))) - 1.0, tf.int64)
    lengths = tf.clip_by_value(lengths, 0, MAX_HISTORY)
    # One column of its own (number 26) for the items: an item's ID and affinity are the same in every slot.
    items, affinities = _ids_and_affinities(draws[:, 1:], (HISTORY_ITEMS,) * MAX_HISTORY, [26] * MAX_HISTORY)
    held = tf.sequence_mask(lengths, MAX_HISTORY)
    fields = tf.strings.reduce_join(tf.RaggedTensor.from_tensor(items, lengths=lengths), axis=1, separator=separator)
    mean = tf.math.divide_no_nan(tf.reduce_sum(tf.where(held, affinities, 0.0), axis=1),
                                 tf.cast(tf.maximum(lengths, 1), tf.float32))
    return fields, mean


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    first = 0 if split == "train" else data_cfg.synthetic_examples
    count = data_cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    seed = data_cfg.seed
    history_separator = data_cfg.separators().get(HISTORY)

    def make(indices):
        draws = tf.map_fn(lambda index: tf.random.stateless_uniform([26 + 13 + 1], [seed, index]), indices,
                          fn_output_signature=tf.float32)
        ids, affinities = _ids_and_affinities(draws[:, :26])
        counts = tf.floor(tf.exp(draws[:, 26:39] * 6.0) - 1.0)  # integer features, heavy tailed
        score = AFFINITY_SCALE * tf.reduce_sum(affinities, axis=1) - 1.2
        features = {name: counts[:, i] for i, name in enumerate(criteo.INTEGER)}
        features.update({name: ids[:, i] for i, name in enumerate(criteo.CATEGORICAL)})
        if history_separator is not None:
            features[HISTORY], history_affinity = _history(seed, indices, history_separator)
            score += HISTORY_SCALE * history_affinity
        labels = tf.cast(draws[:, 39] < tf.sigmoid(score), tf.int64)
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
