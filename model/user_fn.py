"""A user's TF1 Estimator model_fn as a model of the trainer: `--model_fn=FILE.py:FUNCTION`.

The function takes `features` and any of `labels`, `mode`, `params` (--model_fn_params) and `config`
(None), as an Estimator's model_fn does, and returns an EstimatorSpec (ps_trainer.estimator's, or any
object with its fields) on the contract the trainer's own models keep (model/spec.py): its `predictions`
are the logits, and in TRAIN mode it has a `loss`. Where it leaves the update to the runtime (no
`train_op`), the trainer trains that loss as it trains its own models (--optimizer, --learning_rate and
the levers: --local_steps, --accumulate_batches, --sync_replicas); where it returns a `train_op`, that op is
the update, run as written with its training hooks, as an Estimator runs it (training/graph.py refuses the
levers that make the update themselves, in one line). Either way it reads the trainer's input sources (--dataset:
the features a model_fn reads by name; a --multi_valued_columns column as a SparseTensor of its values,
as TF1's parse_example gave a variable-length feature), and judges held-out data, exports and serves by the logits,
as for its own models. The same file also runs in an Estimator program (docs/estimator.md).
"""

import ast
import functools
import importlib.util
import os
import re
import sys

import tensorflow as tf
from absl import flags

from ps_trainer.model import dynamic, multi_valued, spec
from ps_trainer.model.dynamic import column
from ps_trainer.model.needs import Needs

# Its tables, if any, are its dynamic_embedding_columns (model/dynamic/column.py), with --embedding=dynamic.
NEEDS = Needs(dynamic_columns=True)


class ModelFnError(ValueError):
    """A model_fn that cannot be loaded or that breaks the contract, in one line naming --model_fn."""


def check(data_spec):
    del data_spec  # what the model_fn reads of the features is its own
    return None


def params_of(pairs) -> dict:
    """--model_fn_params' key=value pairs as the model_fn's params: each value a Python literal where it
    reads as one (a number, a list, True), else the string."""
    found = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key:
            raise ModelFnError(f"--model_fn_params={','.join(pairs)}: {pair!r} is not key=value")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        found[key] = value
    return found


@functools.cache
def load(location: str):
    """The function `location` (FILE.py:FUNCTION) names, its file run once per process."""
    path, _, name = location.rpartition(":")
    if not path or not name:
        raise ModelFnError(f"--model_fn={location}: give the file and the function, as path/to/file.py:model_fn")
    if not os.path.isfile(path):
        raise ModelFnError(f"--model_fn={location}: {path} is not a file")
    # tf.compat.v1.layers in a model_fn needs Keras 2 (tf-keras), chosen before Keras first loads.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    # A module name of its own (registered, as an import would: a dataclass in it looks its module up).
    found = importlib.util.spec_from_file_location(f"model_fn_{os.path.splitext(os.path.basename(path))[0]}", path)
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    try:
        found.loader.exec_module(module)
    except flags.DuplicateFlagError as error:
        named = re.search(r"flag '([^']+)'", str(error))
        raise ModelFnError(
            f"--model_fn={location}: {path} defines an absl flag trainer.py defines too "
            f"(--{named.group(1) if named else '?'}): define "
            "the program's flags where it runs as a program (under `if __name__ == \"__main__\":`), or put the "
            "model_fn in a module of its own") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ModelFnError(f"--model_fn={location}: {path} has no function {name}")
    if not spec.takes(function, "features"):
        raise ModelFnError(f"--model_fn={location}: {name} takes no 'features' argument (a model_fn takes "
                           "features and any of labels, mode, params, config)")
    return function


def model_fn(features, labels, mode: str, params: spec.Params) -> spec.EstimatorSpec:
    """The user's function on the contract: called in the variable scope "model_fn" with its own params, its
    spec checked, its loss 0 for an empty batch (a sync worker with nothing to read in a round sends one,
    input/work_queue.py, and a mean over no examples is NaN)."""
    model_cfg = params.model_cfg
    function = load(model_cfg.model_fn)
    options = dynamic.options_of(model_cfg) if model_cfg.embedding == "dynamic" else None
    # A multi-valued column's values as TF1's input_fns gave a variable-length feature: a SparseTensor
    # [batch, most values], which TF1's categorical columns read (and embedding_column combines).
    separators = params.data_spec.separators
    features = {name: multi_valued.split(value, separators[name]).to_sparse() if name in separators else value
                for name, value in features.items()}
    with tf.compat.v1.variable_scope(model_cfg.name), column.building(params.graph_tables, options,
                                                                      mode == spec.ModeKeys.TRAIN):
        found = spec.call_model_fn(function, features, labels, mode, params_of(model_cfg.model_fn_params), None)
    loss = getattr(found, "loss", None)
    if mode != spec.ModeKeys.PREDICT and loss is None:
        raise ModelFnError(f"--model_fn={model_cfg.model_fn}: its EstimatorSpec has no loss in {mode} mode")
    predictions = getattr(found, "predictions", None)
    logits = predictions.get("logits") if isinstance(predictions, dict) else predictions
    if logits is None or logits.shape.rank != 2:
        raise ModelFnError(f"--model_fn={model_cfg.model_fn}: its EstimatorSpec's predictions are not the logits "
                           "(a tensor [batch, classes], or a dict holding it under 'logits')")
    if mode == spec.ModeKeys.PREDICT:
        return spec.EstimatorSpec(mode, predictions={"logits": logits})
    count = tf.cast(tf.size(labels), tf.float32)
    loss = tf.cond(count > 0, lambda: tf.cast(loss, tf.float32), lambda: tf.constant(0.0), name="cross_entropy")
    update = spec.own_update(found) if mode == spec.ModeKeys.TRAIN else None
    if update is None:
        return spec.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)
    return spec.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss, train_op=update.train_op,
                              training_hooks=update.hooks, training_chief_hooks=update.chief_hooks)
