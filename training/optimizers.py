"""Optimizers by name. Adding one is one table line."""

import math
import re

import tensorflow as tf

from ps_trainer.model import needs, tables

_v1 = tf.compat.v1.train
PARTITION_SUFFIX = re.compile(r"/part_\d+$")  # TensorFlow's name for a shard of a partitioned variable


class RowUpdates:
    """Mixed into an optimizer: its update of a table's rows runs as the table asks (model/tables.RowUpdate:
    inside the lock of a growing dynamic table's shard, marking the rows incremental checkpoints save, and
    without TensorFlow's unique and segment sum for rows a grouped lookup read, which name no row twice).
    The tables are the model's, handed to the optimizer as `graph_tables` (model/graph_tables.py; None: a
    model without tables). Other variables' updates are TensorFlow's."""

    def __init__(self, *args, graph_tables=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.graph_tables = graph_tables

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices):
        update = tables.row_update(self.graph_tables, handle, indices)
        apply = super()._resource_apply_sparse_duplicate_indices
        if update.distinct and apply.__func__ is _v1.Optimizer._resource_apply_sparse_duplicate_indices:  # noqa: SLF001  (TensorFlow's own sparse update, to tell whether a subclass overrides it)
            apply = self._resource_apply_sparse  # gradients summed on the worker already: applied as they come
        return update.of_rows(lambda: apply(grad, handle, indices), indices)

    def _resource_apply_dense(self, grad, handle):
        return tables.row_update(self.graph_tables, handle).of_all(
            lambda: super(RowUpdates, self)._resource_apply_dense(grad, handle))


class SgdOptimizer(RowUpdates, _v1.GradientDescentOptimizer):
    pass


class MomentumOptimizer(RowUpdates, _v1.MomentumOptimizer):
    pass


class AdamOptimizer(RowUpdates, _v1.AdamOptimizer):
    pass


class AdagradOptimizer(RowUpdates, _v1.AdagradOptimizer):
    pass


class RMSPropOptimizer(RowUpdates, _v1.RMSPropOptimizer):
    pass


def _counted_once(updates, global_step, name):
    """Several optimizers' updates as one step: once they are made, global step + 1 (unless it is None)."""
    with tf.control_dependencies(updates):
        if global_step is None:
            return tf.group(*updates, name=name)
        with tf.compat.v1.colocate_with(global_step):
            return tf.compat.v1.assign_add(global_step, 1, name=name).op


class WideAndDeepOptimizer(_v1.Optimizer):
    """The optimizers of the canonical wide-and-deep model (DNNLinearCombinedClassifier): FTRL for the
    wide part, at min(0.2, 1/sqrt(its weight tables)), and Adagrad for the deep part at the learning
    rate. The wide part's weights are sparse and per id: FTRL's per-coordinate rates suit them. The
    wide part is what the model declared (model/needs.py: the variables made in wide_part())."""

    def __init__(self, learning_rate, graph_tables=None):
        super().__init__(use_locking=False, name="WideAndDeep")
        self._graph_tables = graph_tables
        self._deep = AdagradOptimizer(learning_rate, graph_tables=graph_tables)
        self._wide = None

    def compute_gradients(self, *args, **kwargs):
        return self._deep.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars, wide_names = list(grads_and_vars), needs.wide_variable_names()
        wide = [(g, v) for g, v in grads_and_vars if v.op.name in wide_names]
        deep = [(g, v) for g, v in grads_and_vars if v.op.name not in wide_names]
        wide_tables = {PARTITION_SUFFIX.sub("", v.op.name) for _, v in wide}
        if self._wide is None:
            self._wide = GrowableFtrlOptimizer(min(0.2, 1 / math.sqrt(max(1, len(wide_tables)))),
                                               graph_tables=self._graph_tables)
        updates = ([self._wide.apply_gradients(wide)] if wide else []) + (
            [self._deep.apply_gradients(deep)] if deep else [])
        return _counted_once(updates, global_step, name)

    def get_slot(self, var, name):
        return (self._wide if var.op.name in needs.wide_variable_names() else self._deep).get_slot(var, name)

    def weights_from_slots(self, var):
        """The wide part's weights_from_slots (FTRL's); None for the deep part's."""
        return self._wide.weights_from_slots(var) if var.op.name in needs.wide_variable_names() else None

    def get_slot_names(self):
        return sorted(set(self._deep.get_slot_names()) | set(self._wide.get_slot_names() if self._wide else ()))


def named(optimizer) -> str:
    """An optimizer as the logs name it: its str() where its class says one (PartsOptimizer's parts, a Keras
    optimizer a lever took), else its class's name."""
    return type(optimizer).__name__ if type(optimizer).__str__ is object.__str__ else str(optimizer)


class PartsOptimizer(_v1.Optimizer):
    """Optimizers that each update their own part of the model, as one: a program's model_fn that calls one
    minimize per part (the canned wide & deep's Ftrl for its linear part and Adagrad for its DNN) trains under a
    lever, which makes one update (training/step/taken.py). parts: (optimizer, its variables). A variable the
    lever reads through a copy of its own (--local_steps' worker-side copies; the model_fn's var_lists may name
    either) is updated by the optimizer of the variable it copies: `origin(variable)` names that one. The global
    step counts one step per update."""

    def __init__(self, parts, origin=lambda variable: variable):
        super().__init__(use_locking=False, name="Parts")
        self._parts = [(optimizer, {origin(variable).ref() for variable in variables})
                       for optimizer, variables in parts]
        self._origin = origin

    def __str__(self):
        return " and ".join(named(optimizer) for optimizer, _ in self._parts)

    def _optimizer_of(self, variable):
        key = self._origin(variable).ref()
        return next((optimizer for optimizer, owned in self._parts if key in owned), None)

    def compute_gradients(self, *args, **kwargs):
        return self._parts[0][0].compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        by_optimizer = {}
        for grad, variable in grads_and_vars:
            optimizer = self._optimizer_of(variable)
            if optimizer is None:
                raise ValueError(f"{variable.op.name} is updated by none of the optimizers {self}")
            by_optimizer.setdefault(id(optimizer), (optimizer, []))[1].append((grad, variable))
        return _counted_once([optimizer.apply_gradients(pairs) for optimizer, pairs in by_optimizer.values()],
                             global_step, name)

    def get_slot(self, var, name):
        optimizer = self._optimizer_of(var)
        return optimizer.get_slot(var, name) if optimizer is not None else None

    def get_slot_names(self):
        return sorted({name for optimizer, _ in self._parts for name in optimizer.get_slot_names()})


class GrowableFtrlOptimizer(RowUpdates, _v1.FtrlOptimizer):
    """FTRL whose slots can be made for a variable of unknown length (a dynamic table's rows, [None,
    width]): TensorFlow's makes its accumulator with an initializer that needs the whole shape. Such a
    slot starts as Adagrad's does, filled to the variable's shape when it is initialized."""

    def _create_slots(self, var_list):
        for variable in var_list:
            if variable.shape.is_fully_defined():
                super()._create_slots([variable])
                continue
            start = tf.cast(self._initial_accumulator_value, variable.dtype.base_dtype)
            self._get_or_make_slot_with_initializer(
                variable, lambda v=variable, start=start: tf.fill(tf.shape(v), start), variable.shape, variable.dtype,
                "accum", self._accum_name or self._name)
            self._zeros_slot(variable, "linear", self._linear_name or self._name)

    def weights_from_slots(self, var):
        """FTRL-Proximal's weights are a function of its slots: given the rows of a variable's "accum"
        and "linear" slots (a dict by slot name), the rows of the variable, as TensorFlow's FTRL kernel
        sets them after an update. A sum of several workers' changes to the slots is the slots of all
        their updates; a sum of their changes to the weights is not their weights
        (training/step/row_copies.py sets the weights from the summed slots)."""
        del var  # every variable's weights follow from its slots alike
        l1, power = self._l1_regularization_strength, self._learning_rate_power
        l2 = self._l2_regularization_strength + self._beta / (2 * max(self._learning_rate, 1e-36))

        def weights(slots):
            accum, linear = slots["accum"], slots["linear"]
            quadratic = tf.pow(accum, -power) / self._learning_rate + 2 * l2
            return tf.where(tf.abs(linear) > l1, (tf.sign(linear) * l1 - linear) / quadratic, tf.zeros_like(linear))
        return weights


class LazyAdamOptimizer(RowUpdates, _v1.AdamOptimizer):
    """Adam that, for a sparse gradient (an embedding lookup's), updates only the rows the batch
    touched: their moments, and their values. TensorFlow's Adam decays every row's moments at every
    step, so a step costs the whole table (tensorflow/tensorflow#6460). A row untouched for a while
    keeps its old moments, as in TF-Addons' LazyAdam; the bias correction is the global one. Dense
    gradients get Adam's own update."""

    def __init__(self, learning_rate, graph_tables=None):
        super().__init__(learning_rate, name="LazyAdam", graph_tables=graph_tables)

    def _resource_apply_sparse(self, grad, var, indices):
        # Called with indices made unique and their gradients summed (Optimizer's
        # _resource_apply_sparse_duplicate_indices).
        beta1_power, beta2_power = self._get_beta_accumulators()
        dtype = var.dtype.base_dtype
        beta1, beta2 = tf.cast(self._beta1_t, dtype), tf.cast(self._beta2_t, dtype)
        rate = (tf.cast(self._lr_t, dtype) * tf.sqrt(1 - tf.cast(beta2_power, dtype))
                / (1 - tf.cast(beta1_power, dtype)))
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = beta1 * tf.gather(m, indices) + (1 - beta1) * grad
        v_rows = beta2 * tf.gather(v, indices) + (1 - beta2) * tf.square(grad)
        updates = [tf.compat.v1.scatter_update(m, indices, m_rows), tf.compat.v1.scatter_update(v, indices, v_rows),
                   tf.compat.v1.scatter_sub(var, indices,
                                            rate * m_rows / (tf.sqrt(v_rows) + tf.cast(self._epsilon_t, dtype)))]
        return tf.group(*updates)


# Each by name: (learning rate, TrainConfig, the model's GraphTables) -> the optimizer.
OPTIMIZERS = {
    "sgd": lambda lr, cfg, graph_tables=None: SgdOptimizer(lr, graph_tables=graph_tables),
    "momentum": lambda lr, cfg, graph_tables=None: MomentumOptimizer(lr, momentum=cfg.momentum,
                                                                     graph_tables=graph_tables),
    "adam": lambda lr, cfg, graph_tables=None: AdamOptimizer(lr, graph_tables=graph_tables),
    "lazy_adam": lambda lr, cfg, graph_tables=None: LazyAdamOptimizer(lr, graph_tables=graph_tables),
    "adagrad": lambda lr, cfg, graph_tables=None: AdagradOptimizer(lr, graph_tables=graph_tables),
    "rmsprop": lambda lr, cfg, graph_tables=None: RMSPropOptimizer(lr, momentum=cfg.momentum,
                                                                   graph_tables=graph_tables),
    "ftrl_adagrad": lambda lr, cfg, graph_tables=None: WideAndDeepOptimizer(lr, graph_tables=graph_tables),
}


# The value each row of an optimizer slot starts at, by slot name (0 for the others): what the slot
# initializers of the optimizers above give (tests/test_embeddings.py checks it). Rows that a dynamic table
# adds or evicts start there again (model/dynamic/upkeep.py).
SLOT_START = {"accumulator": 0.1, "accum": 0.1, "rms": 1.0}


def slots_and_starts(optimizer, variable) -> list:
    """(slot, start value) of each slot the optimizer keeps for the variable."""
    return [(slot, SLOT_START.get(name, 0.0)) for name in optimizer.get_slot_names()
            if (slot := optimizer.get_slot(variable, name)) is not None]


def make_optimizer(learning_rate, cfg, graph_tables=None) -> tf.compat.v1.train.Optimizer:
    """The optimizer --optimizer names, updating the rows of the tables of `graph_tables` as they ask."""
    return OPTIMIZERS[cfg.optimizer](learning_rate, cfg, graph_tables)
