"""The update rule every step shares: gradients of the loss, held back until the loss is known to be
finite, clipped by their global norm, applied by the optimizer, the global step counted."""

import tensorflow as tf

v1 = tf.compat.v1

NON_FINITE_LOSS = "NonFiniteLoss"  # in the error a NaN or Inf loss raises; training/worker.py reads it


def apply_update(loss, optimizer, global_step, clip_norm=None, summaries=True, var_list=None, grads_and_vars=None):
    """Gradients of the loss (or grads_and_vars, if given), clipped to clip_norm by their global norm,
    applied to the variables (var_list, default the trainable ones), global step + 1 unless it is None;
    the gradients' global norm, before clipping, as a summary."""
    if grads_and_vars is None:
        # Colocated: the gradient of an op on the ps (a wire cast, an embedding gather) is computed there.
        grads_and_vars = guard_finite(loss, optimizer.compute_gradients(loss, var_list=var_list,
                                                                        colocate_gradients_with_ops=True))
    grads, variables = zip(*grads_and_vars)
    norm = global_norm(grads)
    if summaries:
        v1.summary.scalar("gradient_global_norm", norm)
    if clip_norm:
        grads, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=norm)
    return optimizer.apply_gradients(list(zip(grads, variables)), global_step=global_step)


def global_norm(grads):
    """tf.linalg.global_norm, summed on each gradient's device first: one figure crosses from each ps,
    not one per gradient made there (an embedding table's shards, gathered together: model/grouped_lookup)."""
    by_device = {}
    for grad in grads:
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        with v1.colocate_with(values.op):
            by_device.setdefault(values.device, []).append(tf.reduce_sum(tf.square(values)))
    sums = []
    for squares in by_device.values():
        with v1.colocate_with(squares[0].op):
            sums.append(tf.add_n(squares))
    return tf.sqrt(tf.add_n(sums), name="global_norm_of_gradients")  # not the tag: that would be "_1"


def guard_finite(loss, grads_and_vars):
    """Makes every gradient wait for a check that the loss is finite.

    A NaN or Inf loss then fails the step before any update reaches the ps, so the variables and the
    latest checkpoint stay the last good ones. Pairs without a gradient are dropped.
    """
    with tf.control_dependencies([_finite_check(loss)]):
        return [(_identity(grad), var) for grad, var in grads_and_vars if grad is not None]


def finite_gradients(loss, grads):
    """guard_finite for a list of dense gradients, in their order."""
    with tf.control_dependencies([_finite_check(loss)]):
        return [tf.identity(grad) for grad in grads]


def _finite_check(loss):
    return tf.debugging.assert_all_finite(loss, f"{NON_FINITE_LOSS}: the loss is NaN or Inf")


def _identity(grad):
    """The gradient, held where it was made: a gradient made on a ps (an embedding gather's, a wire
    cast's) is not carried to the worker and back."""
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    with v1.colocate_with(values.op, ignore_existing=True):
        held = tf.identity(values)
    return tf.IndexedSlices(held, grad.indices, grad.dense_shape) if isinstance(grad, tf.IndexedSlices) else held
