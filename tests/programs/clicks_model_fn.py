"""A TF1-era model_fn for the trainer's clicks data (user, item and category IDs, numeric features), as a
team writes one for tf.estimator: feature columns and tf.compat.v1.layers. `model_fn` leaves the update to
the runtime (no train_op), so `trainer.py --model_fn=tests/programs/clicks_model_fn.py:model_fn
--dataset=clicks` trains it with the trainer's optimizer and levers; `model_fn_with_update` builds its own
(Adagrad), and the same file trains both under trainer.py and, run as a program
(`python tests/programs/clicks_model_fn.py MODEL_DIR STEPS`), in its own train_and_evaluate over the same data."""

import sys

import tensorflow as tf

import ps_trainer.estimator  # noqa: F401  (tf.estimator.EstimatorSpec)

v1 = tf.compat.v1
BATCH_SIZE, LEARNING_RATE = 64, 0.1


def model_fn(features, labels, mode, params):
    columns = [v1.feature_column.embedding_column(
        v1.feature_column.categorical_column_with_hash_bucket(name, 1000), dimension=params.get("dimension", 8))
        for name in ("user", "item", "category")]
    columns += [v1.feature_column.numeric_column(name) for name in ("hour", "price")]
    net = v1.feature_column.input_layer(features, columns)
    for units in params.get("hidden_units", (32,)):
        net = v1.layers.dense(net, units, activation=tf.nn.relu)
    logits = v1.layers.dense(net, 2)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    # What the held-out evaluation reads in an Estimator program; the trainer's evaluator computes its own.
    auc = v1.metrics.auc(labels, tf.nn.softmax(logits)[:, 1], num_thresholds=1000)
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss, eval_metric_ops={"auc": auc})


def model_fn_with_update(features, labels, mode, params):
    found = model_fn(features, labels, mode, params)
    if mode != tf.estimator.ModeKeys.TRAIN:
        return found
    train_op = v1.train.AdagradOptimizer(LEARNING_RATE).minimize(found.loss, v1.train.get_global_step())
    return found._replace(train_op=train_op)


def input_fn(mode):
    """The trainer's clicks data (ps_trainer.input), as trainer.py --dataset=clicks reads it."""
    from ps_trainer import input as inputs
    training = mode == tf.estimator.ModeKeys.TRAIN
    return inputs.batches(inputs.DataConfig(name="clicks"), inputs.Shard(0, 1), BATCH_SIZE,
                          split="train" if training else "eval", repeat=training)


def main(model_dir: str, steps: int) -> None:
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=42)
    estimator = tf.estimator.Estimator(model_fn_with_update, config=config)
    metrics, _ = tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(input_fn, max_steps=steps),
                                                 tf.estimator.EvalSpec(input_fn, steps=None))
    print(f"held-out auc {metrics['auc']:.4f} at global step {metrics['global_step']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
