"""How the ps tasks learn that training is over.

Each ps task owns a FIFO queue (same shared_name on every side, so workers reach the one the ps
reads). A training replica (chief or worker) that has finished, after its session closed and the
chief's last checkpoint is written, enqueues its replica index into every ps queue. A ps exits once
every replica has reported. Indexes, not bare tokens: a worker that is restarted and finishes twice
is still counted once.
"""

import threading

import tensorflow as tf
from absl import logging

from cluster import spec

WAIT_SLICE_SECS = 0.2


def _done_queue(ps_task: int, num_workers: int):
    with tf.compat.v1.device(f"/job:{spec.PS}/task:{ps_task}"):
        return tf.queue.FIFOQueue(
            capacity=4 * num_workers, dtypes=[tf.int32], shapes=[[]],
            shared_name=f"ps_shutdown_queue_{ps_task}", name=f"ps_shutdown_queue_{ps_task}")


def wait_for_workers_done(server, cluster: spec.ClusterConfig, stop: threading.Event) -> bool:
    """Blocks until every worker has reported done (True) or `stop` is set (False).

    The dequeue blocks in a helper thread while this thread waits on events, so signal handlers
    run. On stop, closing the queue ends the blocked dequeue; the helper is always joined, since
    a process that exits with a thread inside a TensorFlow call aborts.
    """
    graph = tf.Graph()
    with graph.as_default():
        queue = _done_queue(cluster.task_index, cluster.num_workers)
        dequeue, close = queue.dequeue(), queue.close(cancel_pending_enqueues=True)
    pending = set(range(cluster.num_workers))
    with tf.compat.v1.Session(server.target, graph=graph, config=spec.session_config(cluster)) as sess:

        def drain():
            try:
                while pending:
                    worker = int(sess.run(dequeue))
                    pending.discard(worker)
                    logging.info("ps %d: training replica %d finished; waiting for %s",
                                 cluster.task_index, worker, sorted(pending) or "nobody")
            except tf.errors.OutOfRangeError:
                pass  # closed by stop

        drainer = threading.Thread(target=drain, name="ps_shutdown_queue")
        drainer.start()
        while drainer.is_alive() and not stop.is_set():
            drainer.join(WAIT_SLICE_SECS)
        if drainer.is_alive():
            sess.run(close)
            drainer.join()
    return not pending


def signal_worker_done(server, cluster: spec.ClusterConfig, timeout_secs: float = 30.0) -> None:
    """Tells every ps that this worker is done. A ps that is gone already is logged, not fatal."""
    graph = tf.Graph()
    with graph.as_default():
        enqueues = [_done_queue(ps, cluster.num_workers).enqueue(tf.constant(cluster.replica_index))
                    for ps in range(cluster.num_ps)]
    options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
    with tf.compat.v1.Session(server.target, graph=graph, config=spec.session_config(cluster)) as sess:
        for ps, enqueue in enumerate(enqueues):
            try:
                sess.run(enqueue, options=options)
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError, tf.errors.CancelledError) as err:
                logging.warning("could not tell ps %d that %s is done: %s", ps, cluster.task_name,
                                err.message.splitlines()[0])
