"""A DeepCTR (0.9.4) Estimator program, as its estimator examples are written (deepctr.estimator's DeepFM over
feature columns, TF1's numpy input_fns), with one line added: `import ps_trainer.estimator`. DeepCTR reaches
into the Estimator's internals (`tensorflow.python.estimator.canned.head._Head`,
`canned.optimizers.get_optimizer_instance`). Clicks whose label follows one ID's parity, 15% flipped: the
held-out AUC the labels allow is about 0.85."""

import sys

import numpy as np
import tensorflow as tf

import ps_trainer.estimator  # noqa: F401  (the one line added)
from deepctr.estimator import DeepFMEstimator


def data(examples, seed):
    rng = np.random.RandomState(seed)
    first, second = rng.randint(0, 50, examples), rng.randint(0, 30, examples)
    label = ((first % 2) ^ (rng.rand(examples) < 0.15)).astype(np.float32)
    return {"C1": first.astype(str), "C2": second.astype(str), "I1": rng.rand(examples).astype(np.float32),
            "C1_id": first.astype(np.int64)}, label


def main(model_dir: str) -> None:
    linear = [tf.feature_column.categorical_column_with_identity("C1_id", 50)]
    dnn = [tf.feature_column.embedding_column(tf.feature_column.categorical_column_with_hash_bucket(name, 100), 4)
           for name in ("C1", "C2")] + [tf.feature_column.numeric_column("I1")]
    # Seeded as DeepCTR's examples seed it: without a seed each run starts elsewhere (seen: AUC 0.80-0.85).
    model = DeepFMEstimator(linear, dnn, task="binary", model_dir=model_dir,
                            config=tf.estimator.RunConfig(tf_random_seed=2021))
    numpy_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn
    x, y = data(3000, 0)
    model.train(numpy_input_fn(x, y, batch_size=64, num_epochs=5, shuffle=True))
    x, y = data(1000, 1)
    metrics = model.evaluate(numpy_input_fn(x, y, batch_size=256, shuffle=False))
    scored = list(model.predict(numpy_input_fn({name: value[:5] for name, value in x.items()}, shuffle=False)))
    columns = tf.compat.v1.feature_column.make_parse_example_spec(linear + dnn)
    exported = model.export_saved_model(
        f"{model_dir}/export", tf.compat.v1.estimator.export.build_parsing_serving_input_receiver_fn(columns))
    print(f"AUC {metrics['AUC']:.4f} at global step {metrics['global_step']}; scored {len(scored)} "
          f"(pred {scored[0]['pred'][0]:.3f}); exported {exported.decode()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
