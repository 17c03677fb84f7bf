"""How a task's run ends in its exit code (training/exit_codes.py): the one mapping from what reaches the top of a
role to README's table, for trainer.py's roles and an Estimator program's (ps_trainer/estimator/) alike. Each
ending but done is logged in one line; permanent_reason says which endings end the whole job."""

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


def permanent_reason(err: Exception) -> str | None:
    """The one-line reason of an error that ends this task permanently (exit 1, which no orchestrator retries as
    is), or None for a transient one. MODEL_DIR_IN_USE is None too: the model_dir is another run's, whose tasks
    go on."""
    if isinstance(err, exit_codes.Failure):
        permanent = err.outcome.kind == exit_codes.PERMANENT and err.outcome is not exit_codes.MODEL_DIR_IN_USE
        return str(err) if permanent else None
    if isinstance(err, CLUSTER_ERRORS):
        return None
    if isinstance(err, user_fn.ModelFnError):
        return str(err)
    cause = log_lines.error_cause(err.message) if isinstance(err, tf.errors.OpError) else str(err).split("\n")[0]
    return f"{type(err).__name__}: {cause}"  # a traceback: ERROR


def with_the_chief(who: str, reason: str) -> exit_codes.Failure:
    """The ending of a task (`who`) whose chief ended in a permanent error for `reason` (cluster/shutdown.py's mark)."""
    return exit_codes.Failure(f"{who}: the chief ended in a permanent error, so nothing more will train; exiting with "
                              f"it: {reason}", exit_codes.CHIEF_FAILED)
