"""Where variables live: on the ps tasks, balanced by bytes; every other op on this worker."""

import numpy as np
import tensorflow as tf

from ps_trainer.cluster import spec


def variable_byte_size(op) -> int:
    """Bytes a variable op will hold, from its 'shape' and 'dtype' attrs.

    TensorFlow's byte_size_load_fn reads the op's output shape, which for a resource variable
    (VarHandleOp) is a scalar handle: every variable would weigh 0 and all land on ps 0.
    """
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except ValueError:
        return 0
    if not shape.is_fully_defined():
        return 0
    return int(np.prod(shape.as_list(), dtype=np.int64)) * dtype.size


class ByteBalancedStrategy:
    """ps_strategy for replica_device_setter: each variable goes to the ps holding fewest bytes so far.

    The greedy load balancer contrib used to give. An op already bound to a ps task keeps it and
    counts toward that task: one pinned by device (SyncReplicasOptimizer's accumulators) or
    colocated with a placed variable (optimizer slots), whatever the setter then returns.
    """

    def __init__(self, num_tasks: int):
        self.loads = [0] * num_tasks

    def __call__(self, op) -> int:
        task = _bound_ps_task(op)
        if task is None:
            task = min(range(len(self.loads)), key=self.loads.__getitem__)
        self.loads[task] += variable_byte_size(op)
        return task


def _bound_ps_task(op) -> int | None:
    device = op.device
    if not device:
        own = f"loc:@{op.name}".encode()
        for group in op.colocation_groups():
            if group != own:
                device = op.graph.get_operation_by_name(group[len(b"loc:@"):].decode()).device
                break
    bound = tf.DeviceSpec.from_string(device or "")
    return bound.task if bound.job == spec.PS else None


def device_setter(cluster: spec.ClusterConfig):
    """replica_device_setter that spreads variables over the ps tasks greedily by byte size."""
    strategy = ByteBalancedStrategy(cluster.num_ps)
    return tf.compat.v1.train.replica_device_setter(
        ps_tasks=cluster.num_ps,
        worker_device=cluster.compute_device(),
        cluster=cluster.cluster_spec(),
        ps_strategy=strategy,
    )


def _ps_variables(graph):
    """(ps device, variable op) of each global variable of `graph` placed on a ps task."""
    for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        device = tf.DeviceSpec.from_string(variable.op.device)
        if device.job == spec.PS:
            yield f"/job:ps/task:{device.task}", variable.op


def bytes_per_ps(graph) -> dict[str, int]:
    """Variable bytes placed on each ps device of `graph`, for the startup report (a variable whose
    length is not known yet, a growing table's, counts 0: growing_per_ps)."""
    totals = {}
    for device, op in _ps_variables(graph):
        totals[device] = totals.get(device, 0) + variable_byte_size(op)
    return dict(sorted(totals.items()))


def growing_per_ps(graph) -> dict[str, int]:
    """How many variables on each ps have a length that grows (dynamic tables with --embedding_growth:
    their rows and slots), which bytes_per_ps cannot size."""
    counts = {}
    for device, op in _ps_variables(graph):
        try:
            known = tf.TensorShape(op.get_attr("shape")).is_fully_defined()
        except ValueError:  # no shape attr: nothing to count
            continue
        if not known:
            counts[device] = counts.get(device, 0) + 1
    return counts
