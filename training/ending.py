"""How a task's run ends in its exit code (training/exit_codes.py): the one mapping from what reaches the top of a
role to README's table, for trainer.py's roles and an Estimator program's (ps_trainer/estimator/) alike. Each
ending but done is logged in one line."""

from typing import Callable

import tensorflow as tf
from absl import logging

from ps_trainer.model import user_fn
from ps_trainer.training import exit_codes, log_lines

# What TensorFlow raises when a task of the cluster stops answering: a restart may succeed.
CLUSTER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError)


def exit_code_of(run: Callable[[], int]) -> int:
    """run()'s exit code, or the code of the ending it raised, with its one-line reason logged."""
    try:
        return run()
    except exit_codes.Failure as err:
        logging.error("%s", err)
        return err.outcome.code
    except user_fn.ModelFnError as err:  # a model_fn that breaks the contract (model/user_fn.py)
        logging.error("%s", err)
        return exit_codes.MODEL_FN_BROKEN.code
    except CLUSTER_ERRORS as err:
        logging.error("%s: %s (exit %d: a restart may succeed)", exit_codes.CLUSTER_UNAVAILABLE.meaning,
                      log_lines.error_cause(err.message), exit_codes.RETRY)
        return exit_codes.RETRY
