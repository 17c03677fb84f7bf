"""The module paths Estimator code imports from, resolved to this implementation: `tensorflow_estimator` (the
package TF 2.x programs installed: `import tensorflow_estimator as tfe; tfe.estimator.X`), and the internals
that libraries reach into under `tensorflow_estimator.python.estimator.*` and `tensorflow.python.estimator.*`
(DeepCTR: `canned.head._Head`, `canned.optimizers.get_optimizer_instance`; TF 2.x's `head.*` modules). Each path
is registered in sys.modules, so `import` and `from ... import` find these objects and load nothing of their own;
a name the internals do not cover fails where it is used, naming it."""

import abc
import sys
import types

import tensorflow.python as tensorflow_python

from ps_trainer.estimator import (canned, canned_v2, distribute, early_stopping, estimator, export, exporters, heads,
                                  inputs, keras_optimizers, run_config)
from ps_trainer.model import spec

PREFIXES = ("tensorflow_estimator.python.estimator", "tensorflow.python.estimator")
# The modules of TF's canned estimators and what they held: the V1 class by its name, the V2 class as <name>V2.
CANNED = {"dnn": ("DNNClassifier", "DNNRegressor"), "linear": ("LinearClassifier", "LinearRegressor"),
          "dnn_linear_combined": ("DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor"),
          "baseline": ("BaselineClassifier", "BaselineRegressor")}


class _AnyHead(abc.ABC):
    """What TF1's and TF 2.x's head interfaces share."""

    @property
    @abc.abstractmethod
    def name(self):
        """The head's name, the suffix of its metric keys, or None."""

    @property
    @abc.abstractmethod
    def logits_dimension(self):
        """The last dimension of the logits this head takes."""


class HeadV2(_AnyHead):
    """TF 2.x's head interface (tf.estimator.Head, head/base_head.py's Head), which tf.estimator's heads implement:
    a program's or a library's head subclasses it and implements each member, as TF 2.15 asked."""

    @property
    @abc.abstractmethod
    def loss_reduction(self):
        """The Keras reduction of the loss over the batch."""

    @abc.abstractmethod
    def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
        """The reduced loss of a batch."""

    @abc.abstractmethod
    def predictions(self, logits, keys=None):
        """The predictions from the logits, by key."""

    @abc.abstractmethod
    def metrics(self, regularization_losses=None):
        """The eval metrics by key: Keras metric objects."""

    @abc.abstractmethod
    def update_metrics(self, eval_metrics, features, logits, labels, mode=None, regularization_losses=None):
        """eval_metrics, each updated with the batch."""

    @abc.abstractmethod
    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, trainable_variables=None,
                              train_op_fn=None, update_ops=None, regularization_losses=None):
        """The EstimatorSpec of `mode`."""


for _head in (heads.BinaryClassHead, heads.MultiClassHead, heads.RegressionHead, heads.MultiLabelHead, heads.MultiHead):
    HeadV2.register(_head)
# TF 2.x's head package (tf.estimator.*Head): its modules and what each held.
HEADS = {"base_head": {"Head": HeadV2}, "binary_class_head": {"BinaryClassHead": heads.BinaryClassHead},
         "multi_class_head": {"MultiClassHead": heads.MultiClassHead},
         "multi_label_head": {"MultiLabelHead": heads.MultiLabelHead},
         "regression_head": {"RegressionHead": heads.RegressionHead,
                             "PoissonRegressionHead": heads.PoissonRegressionHead,
                             "LogisticRegressionHead": heads.LogisticRegressionHead},
         "multi_head": {"MultiHead": heads.MultiHead}}


class _Head(_AnyHead):
    """TF1's head interface (canned/head.py's _Head): what a head gives a model_fn from its logits. A library's
    head subclasses it and implements each member."""

    @abc.abstractmethod
    def create_loss(self, features, mode, logits, labels):
        """The loss of a batch."""

    @abc.abstractmethod
    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, train_op_fn=None,
                              regularization_losses=None):
        """The EstimatorSpec of `mode`."""


def _module(name: str, doc: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__dict__.update(attributes)

    def __getattr__(attribute):
        raise AttributeError(f"{name}.{attribute} is not covered by ps_trainer.estimator (docs/estimator.md lists "
                             "what is)")
    module.__getattr__ = __getattr__
    return module


def _internals(prefix: str, public) -> dict[str, types.ModuleType]:
    """The internal modules under `prefix`, by their full names."""
    head = _module(f"{prefix}.canned.head", "TF1's head interface.", _Head=_Head)
    optimizers = _module(f"{prefix}.canned.optimizers", "TF's optimizer lookups, V1's and V2's.",
                         get_optimizer_instance=canned.get_optimizer_instance,
                         get_optimizer_instance_v2=keras_optimizers.get_optimizer_instance_v2)
    kinds = {kind: _module(f"{prefix}.canned.{kind}", f"TF's canned {kind} estimators, V1 and V2.",
                           **{name: getattr(canned, name) for name in names},
                           **{name + "V2": getattr(canned_v2, name) for name in names})
             for kind, names in CANNED.items()}
    canned_ = _module(f"{prefix}.canned", "TF's canned estimators.", head=head, optimizers=optimizers, **kinds)
    model_fn = _module(f"{prefix}.model_fn", "TF1's EstimatorSpec.", EstimatorSpec=spec.EstimatorSpec,
                       ModeKeys=spec.ModeKeys)
    export_ = _module(f"{prefix}.export", "TF1's export package.",
                      **{name: getattr(export, name) for name in dir(export) if not name.startswith("_")},
                      export=export, export_lib=export)
    head_modules = {kind: _module(f"{prefix}.head.{kind}", f"TF 2.x's {kind}.", **held) for kind, held in HEADS.items()}
    root = _module(prefix, "TF's Estimator package.", canned=canned_, model_fn=model_fn, export=export_,
                   estimator=estimator, estimator_lib=public, run_config=run_config, training=distribute,
                   exporter=exporters, inputs=inputs, early_stopping=early_stopping,
                   head=_module(f"{prefix}.head", "TF 2.x's heads.", **head_modules))
    modules = {prefix: root, f"{prefix}.canned": canned_, f"{prefix}.canned.head": head,
               f"{prefix}.canned.optimizers": optimizers, f"{prefix}.model_fn": model_fn,
               f"{prefix}.export": export_, f"{prefix}.export.export": export, f"{prefix}.export.export_lib": export,
               f"{prefix}.estimator": estimator, f"{prefix}.estimator_lib": public,
               f"{prefix}.run_config": run_config, f"{prefix}.training": distribute,
               f"{prefix}.exporter": exporters, f"{prefix}.inputs": inputs,
               f"{prefix}.early_stopping": early_stopping}
    modules.update({f"{prefix}.canned.{kind}": module for kind, module in kinds.items()})
    modules[f"{prefix}.head"] = root.head
    modules.update({f"{prefix}.head.{kind}": module for kind, module in head_modules.items()})
    return modules


def install(public, public_v2) -> None:
    """Registers every path for `public`, the ps_trainer.estimator module (tf.compat.v1.estimator), and
    `public_v2`, its V2 face (tf.estimator): the `tensorflow_estimator.estimator` of a TF 2.x program."""
    modules = {}
    for prefix in PREFIXES:
        modules.update(_internals(prefix, public))
    python = _module("tensorflow_estimator.python", "", estimator=modules[PREFIXES[0]])
    package = _module("tensorflow_estimator", "TF's Estimator, as the tensorflow_estimator package.",
                      estimator=public_v2, python=python)
    modules["tensorflow_estimator"] = package
    modules["tensorflow_estimator.python"] = package.python
    for name, module in modules.items():
        sys.modules.setdefault(name, module)
    tensorflow_python.estimator = sys.modules[PREFIXES[1]]
