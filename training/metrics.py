"""Live metrics in Prometheus's text format, for scrapers (--metrics_port; off by default).

Every task serves http://<its own cluster host>:<--metrics_port>/metrics with prometheus_client,
from a registry of its own: a task's role (`pstrainer_task_info`), and on a worker the global step,
its examples/s, loss, accuracy and staleness as of its last progress line (every
--log_every_n_steps), its local steps, and at the end the held-out figures of the final
checkpoint; the chief also the bytes of variables each ps holds. The server listens on the task's
own address in the cluster, never on every interface (the gRPC port's rule: docs/security.md), and
on 127.0.0.1 for a run in one process. The tasks of a local cluster on one host need a port each.
"""

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from ps_trainer.cluster import spec


class TaskMetrics:
    """The gauges of one task; each update is a few dictionary writes, whether served or not."""

    def __init__(self, task_name: str, job: str | None):
        self.registry = CollectorRegistry()

        def gauge(name, documentation, *labels):
            return Gauge(f"pstrainer_{name}", documentation, ["task", *labels], registry=self.registry)

        self.task = task_name
        info = gauge("task_info", "1 for a running task, labelled with its job", "job")
        info.labels(task_name, job or "local").set(1)
        self._global_step = gauge("global_step", "The global step this worker last read").labels(task_name)
        # Named local_steps where it is served (as in the finished line): this worker's own steps.
        self._own_steps = gauge("local_steps", "Training steps this worker has run").labels(task_name)
        self._examples = gauge("examples_per_second", "This worker's examples/s over its last progress interval"
                               ).labels(task_name)
        self._loss = gauge("loss", "The training loss of this worker's last logged batch").labels(task_name)
        self._accuracy = gauge("accuracy", "The training accuracy of this worker's last logged batch").labels(task_name)
        self._staleness = gauge("staleness", "Other workers' updates between this worker's reads, per step, over "
                                "its last progress interval", "stat")
        self._heldout = gauge("heldout", "The final checkpoint's figure on the held-out split (the chief)", "metric")
        self._ps_bytes = gauge("ps_variable_bytes", "Bytes of variables placed on each ps (the chief's placement)",
                               "ps")

    def progress(self, global_step: int, own_steps: int, examples_per_sec: float, loss, accuracy,
                 staleness: dict[str, float]) -> None:
        self._global_step.set(global_step)
        self._own_steps.set(own_steps)
        self._examples.set(examples_per_sec)
        if loss is not None:
            self._loss.set(loss)
            self._accuracy.set(accuracy)
        for stat, value in staleness.items():
            self._staleness.labels(self.task, stat).set(value)

    def held_out(self, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self._heldout.labels(self.task, name).set(value)

    def ps_bytes(self, bytes_per_ps: dict[str, int]) -> None:
        for device, size in bytes_per_ps.items():
            self._ps_bytes.labels(self.task, device).set(size)


def serve(cluster: spec.ClusterConfig, port: int) -> TaskMetrics:
    """This task's metrics, served on `port` of its own cluster host if port is set."""
    metrics = TaskMetrics(cluster.task_name, cluster.job_name)
    if port:
        host = spec.split_host_port(cluster.own_address())[0] if cluster.is_distributed else "127.0.0.1"
        start_http_server(port, addr=host, registry=metrics.registry)
    return metrics
