"""TF1's Estimator API on ps-trainer's parameter-server runtime, for programs written for tf.estimator
(removed from TensorFlow in 2.16). One line after `import tensorflow as tf`:

    import ps_trainer.estimator

and the program's `tf.compat.v1.estimator.X` is this module's X (`from ps_trainer import estimator`), and its
`tf.estimator.X` and `tf.compat.v2.estimator.X` are ps_trainer.estimator.v2's: the same names, but for the canned
classes, which are TF 2.x's V2 classes there (canned_v2.py) as TF1's V1 classes are here (canned.py). It defines
no absl flags and parses nothing.
docs/estimator.md lists the names it covers; any other name fails where the program uses it, naming it.
"""

import importlib.util
import os
import sys

# tf.compat.v1.layers (which model_fns use) needs Keras 2, tf-keras: TensorFlow's lazy loaders read this
# when the program first touches tf.keras or tf.compat.v1.layers, after this import.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402  (after the Keras choice)
from tensorflow.python.platform import tf_logging as _logging  # noqa: E402  (tf.compat.v1.logging: a program's)
from tensorflow.python.tools import module_util as _module_util  # noqa: E402  (where TensorFlow finds Keras)

from ps_trainer.estimator import experimental, export, extras, feature_column, inputs  # noqa: E402
from ps_trainer.estimator.canned import (  # noqa: E402
    BaselineClassifier, BaselineRegressor, DNNClassifier, DNNEstimator, DNNLinearCombinedClassifier,
    DNNLinearCombinedEstimator, DNNLinearCombinedRegressor, DNNRegressor, LinearClassifier, LinearEstimator,
    LinearRegressor)
from ps_trainer.estimator.distribute import EvalSpec, TrainSpec, train_and_evaluate  # noqa: E402
from ps_trainer.estimator.estimator import Estimator, WarmStartSettings  # noqa: E402
from ps_trainer.estimator.exporters import BestExporter, Exporter, FinalExporter, LatestExporter  # noqa: E402
from ps_trainer.estimator.heads import (  # noqa: E402
    BinaryClassHead, LogisticRegressionHead, MultiClassHead, MultiHead, MultiLabelHead, PoissonRegressionHead,
    RegressionHead)
from ps_trainer.estimator import module_paths  # noqa: E402
from ps_trainer.estimator.run_config import RunConfig  # noqa: E402
from ps_trainer.model.spec import EstimatorSpec, ModeKeys  # noqa: E402

__all__ = ["BaselineClassifier", "BaselineRegressor", "BestExporter", "BinaryClassHead", "DNNClassifier",
           "DNNEstimator", "DNNLinearCombinedClassifier", "DNNLinearCombinedEstimator", "DNNLinearCombinedRegressor",
           "DNNRegressor", "Estimator", "EstimatorSpec", "EvalSpec", "Exporter", "FinalExporter", "Head",
           "LatestExporter",
           "LinearClassifier", "LinearEstimator", "LinearRegressor", "LogisticRegressionHead", "ModeKeys",
           "MultiClassHead", "MultiHead", "MultiLabelHead", "PoissonRegressionHead", "RegressionHead", "RunConfig",
           "TrainSpec",
           "experimental", "export", "inputs", "VocabInfo", "WarmStartSettings", "feature_column", "train_and_evaluate"]

VocabInfo = tf.compat.v1.train.VocabInfo  # WarmStartSettings.var_name_to_vocab_info's values, as TF1's
Head = module_paths.HeadV2  # TF 2.x's abstract head interface, which a program's own head subclasses
globals().update({name: getattr(tf.compat.v1.train, name) for name in extras.HOOKS})
add_metrics = extras.add_metrics
classifier_parse_example_spec, regressor_parse_example_spec = extras.parse_example_specs(
    tf.compat.v1.feature_column.make_parse_example_spec)
__all__ += [*extras.HOOKS, "add_metrics", "classifier_parse_example_spec", "regressor_parse_example_spec"]


def __getattr__(name):
    raise AttributeError(f"tf.estimator.{name} is not covered by ps_trainer.estimator (docs/estimator.md lists "
                         "what is)")


def _keras_2_chosen() -> bool:
    """TF_USE_LEGACY_KERAS as TensorFlow's lazy loaders read it: this import's "1" unless the program set it."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")


def _install(v1_module, v2_module) -> None:
    """Makes this module tf.compat.v1.estimator and its v2 module tf.estimator and tf.compat.v2.estimator for
    good, and tf.keras Keras 2 for `from tensorflow.keras... import`.

    TensorFlow's API modules load as tensorflow._api.v2.*: the first `import tensorflow.compat.v1` (Keras and
    tf_keras make one as they load) would load fresh copies under the public names and rebind tf.compat to
    them, losing the attribute. Registered under those names here, the import finds these same objects."""
    api = "tensorflow._api.v2."
    for name, module in list(sys.modules.items()):
        if name.startswith(api) and module is not None:
            sys.modules.setdefault("tensorflow." + name[len(api):], module)
    tf.estimator = v2_module
    module_paths.install(v1_module, v2_module)
    for name, module in list(sys.modules.items()):
        if name.startswith("tensorflow") and name.endswith(("compat.v1", "compat.v2")) and module is not None:
            module.estimator = v1_module if name.endswith("compat.v1") else v2_module
    # `from tensorflow.keras.layers import Dense` is found through tensorflow.__path__, which TensorFlow set at
    # its import for the Keras chosen then: Keras 3 where TF_USE_LEGACY_KERAS came later (this module sets it).
    if not _keras_2_chosen():  # the program chose Keras 3
        return
    legacy = _module_util.get_parent_dir_for_name("tf_keras.api._v2.keras")
    keras_3 = _module_util.get_parent_dir_for_name("keras.api._v2.keras")
    if legacy and legacy not in tf.__path__:
        tf.__path__[:] = [legacy, *(path for path in tf.__path__ if path != keras_3)]


KERAS_2_MISSING = ("tf-keras is not installed: a program's tf.compat.v1.layers and tf.keras, and tf.estimator's "
                   "V2 classes, need Keras 2 (the cpu and gpu extras of README's set-up install it)")


def _warn_if_keras_2_missing() -> None:
    """One line at import where Keras 2 is chosen and absent: TensorFlow's own error, at the program's first use
    of Keras, says only "Keras cannot be imported"."""
    if _keras_2_chosen() and importlib.util.find_spec("tf_keras") is None:
        _logging.warning(KERAS_2_MISSING)


from ps_trainer.estimator import v2  # noqa: E402  (made of the names above)

_install(sys.modules[__name__], v2)
_warn_if_keras_2_missing()
