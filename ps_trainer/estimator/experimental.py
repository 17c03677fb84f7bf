"""tf.estimator.experimental (and tf.compat.v1.estimator.experimental): TF 2.x's early-stopping hooks
(early_stopping.py), make_stop_at_checkpoint_step_hook (stop_at_checkpoint.py), InMemoryEvaluatorHook
(in_memory_evaluator.py) and TF1's logit_fn builders (canned.py). Its other names (LinearSDCA, ...) are not covered
and fail where a program uses them, naming themselves."""

from ps_trainer.estimator.canned import dnn_logit_fn_builder, linear_logit_fn_builder  # noqa: F401
from ps_trainer.estimator.early_stopping import (  # noqa: F401  (this module's names)
    make_early_stopping_hook, stop_if_higher_hook, stop_if_lower_hook, stop_if_no_decrease_hook,
    stop_if_no_increase_hook)
from ps_trainer.estimator.in_memory_evaluator import InMemoryEvaluatorHook  # noqa: F401
from ps_trainer.estimator.stop_at_checkpoint import make_stop_at_checkpoint_step_hook  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"tf.estimator.experimental.{name} is not covered by ps_trainer.estimator "
                         "(docs/estimator.md lists what is)")
