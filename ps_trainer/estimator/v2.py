"""`tf.estimator` and `tf.compat.v2.estimator` in a program with the one line: ps_trainer.estimator's names (which
are `tf.compat.v1.estimator`'s), with TF 2.x's V2 canned classes (canned_v2.py) where TF 2.x had them."""

import tensorflow as _tf

from ps_trainer.estimator import *  # noqa: F403  (the package's names; the canned classes below replace its V1 ones)
from ps_trainer.estimator import __all__ as _package_names
from ps_trainer.estimator.canned_v2 import (  # noqa: F401  (this module's names)
    BaselineClassifier, BaselineRegressor, DNNClassifier, DNNEstimator, DNNLinearCombinedClassifier,
    DNNLinearCombinedEstimator, DNNLinearCombinedRegressor, DNNRegressor, LinearClassifier, LinearEstimator,
    LinearRegressor)

from ps_trainer.estimator.extras import parse_example_specs as _parse_example_specs

__all__ = list(_package_names)
# TF 2.x's spell v2 feature columns' parsing specs.
classifier_parse_example_spec, regressor_parse_example_spec = _parse_example_specs(
    _tf.compat.v2.feature_column.make_parse_example_spec)


def __getattr__(name):
    raise AttributeError(f"tf.estimator.{name} is not covered by ps_trainer.estimator (docs/estimator.md lists "
                         "what is)")
