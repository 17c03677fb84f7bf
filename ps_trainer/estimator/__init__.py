"""TF1's Estimator API on ps-trainer's parameter-server runtime, for programs written for tf.estimator
(removed from TensorFlow in 2.16). One line after `import tensorflow as tf`:

    import ps_trainer.estimator

and the program's `tf.estimator.X` and `tf.compat.v1.estimator.X` are this module's X; it is also
importable by name (`from ps_trainer import estimator`). It defines no absl flags and parses nothing.
docs/estimator.md lists the names it covers; any other name fails where the program uses it, naming it.
"""

import os
import sys

# tf.compat.v1.layers (which model_fns use) needs Keras 2, tf-keras: TensorFlow's lazy loaders read this
# when the program first touches tf.keras or tf.compat.v1.layers, after this import.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402  (after the Keras choice)

from ps_trainer.estimator import export, feature_column, inputs  # noqa: E402
from ps_trainer.estimator.canned import (  # noqa: E402
    DNNClassifier, DNNLinearCombinedClassifier, DNNLinearCombinedRegressor, DNNRegressor, LinearClassifier,
    LinearRegressor)
from ps_trainer.estimator.distribute import EvalSpec, TrainSpec, train_and_evaluate  # noqa: E402
from ps_trainer.estimator.estimator import Estimator, WarmStartSettings  # noqa: E402
from ps_trainer.estimator.exporters import BestExporter, Exporter, FinalExporter, LatestExporter  # noqa: E402
from ps_trainer.estimator.run_config import RunConfig  # noqa: E402
from ps_trainer.model.spec import EstimatorSpec, ModeKeys  # noqa: E402

__all__ = ["BestExporter", "DNNClassifier", "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor",
           "DNNRegressor", "Estimator", "EstimatorSpec", "EvalSpec", "Exporter", "FinalExporter", "LatestExporter",
           "LinearClassifier", "LinearRegressor", "ModeKeys", "RunConfig", "TrainSpec", "export", "inputs",
           "VocabInfo", "WarmStartSettings", "feature_column", "train_and_evaluate"]

VocabInfo = tf.compat.v1.train.VocabInfo  # WarmStartSettings.var_name_to_vocab_info's values, as TF1's


def __getattr__(name):
    raise AttributeError(f"tf.estimator.{name} is not covered by ps_trainer.estimator (docs/estimator.md lists "
                         "what is)")


tf.estimator = tf.compat.v1.estimator = sys.modules[__name__]
