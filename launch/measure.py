"""Where a step goes, measured from outside the processes: CPU time per global step of each task (from
/proc/<pid>/stat) and bytes on the loopback interface per global step (/proc/net/dev), sampled while a
run is under way against the global step its chief's log reports."""

import dataclasses
import os
import pathlib
import threading
import time

from ps_trainer.training import log_lines

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_secs(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads; None once it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat


def loopback_bytes() -> int:
    """Bytes sent on the loopback interface so far (each byte between two local processes, once)."""
    for line in pathlib.Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])  # receive has 8 counters, then transmit bytes
    return 0


@dataclasses.dataclass(frozen=True)
class Sample:
    step: int
    cpu: dict[str, float]  # task name: CPU seconds so far
    loopback: int


@dataclasses.dataclass(frozen=True)
class StepCost:
    cpu_ms: dict[str, float]  # task name: CPU ms per global step
    loopback_bytes: float  # bytes on loopback per global step
    steps: int  # global steps measured

    @property
    def total_cpu_ms(self) -> float:
        return sum(self.cpu_ms.values())


class StepSampler:
    """Samples every task's CPU time and the loopback counter with the chief's latest logged global
    step, every `interval` s, in a thread, until stopped."""

    def __init__(self, chief_log: pathlib.Path, pids: dict[str, int], interval: float = 0.25):
        self.chief_log, self.pids, self.interval = chief_log, pids, interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self):
        last_step = None
        while not self._stop.wait(self.interval):
            try:
                steps = log_lines.steps(self.chief_log.read_text(errors="replace"))
            except FileNotFoundError:
                continue
            if not steps or steps[-1].step == last_step:
                continue  # a sample only when a new progress line says where the run is
            last_step = steps[-1].step
            cpu = {task: cpu_secs(pid) for task, pid in self.pids.items()}
            if None in cpu.values():
                return  # a task has exited: the run is ending
            self.samples.append(Sample(last_step, cpu, loopback_bytes()))

    def cost(self, from_step: int) -> StepCost | None:
        """Per global step between the first sample at or past from_step and the last sample."""
        window = [s for s in self.samples if s.step >= from_step]
        if len(window) < 2 or window[-1].step == window[0].step:
            return None
        first, last = window[0], window[-1]
        steps = last.step - first.step
        return StepCost({task: 1000 * (last.cpu[task] - first.cpu[task]) / steps for task in self.pids},
                        (last.loopback - first.loopback) / steps, steps)


def wait_for_first_step(log: pathlib.Path, timeout: float, alive) -> float | None:
    """Seconds until the log shows a first step (polled every 0.2 s); None if `alive()` turns False
    or the timeout passes first."""
    start = time.monotonic()
    while time.monotonic() - start < timeout and alive():
        if log.exists() and log_lines.first_steps(log.read_text(errors="replace")):
            return time.monotonic() - start
        time.sleep(0.2)
    return None


# ---------------------------------------------------------------- round trips, from TensorFlow's own partitioning
@dataclasses.dataclass(frozen=True)
class RoundTrips:
    run_graph: int  # RunGraph calls to other tasks per session.run: one per ps holding part of the step
    recv_tensor: int  # tensors pulled across tasks per session.run (each a RecvTensor call)
    steps_per_run: int

    @property
    def per_step(self) -> float:
        return (self.run_graph + self.recv_tensor) / self.steps_per_run


def round_trips(cfg) -> RoundTrips:
    """The RPCs one run of a worker's train op makes, counted on the partition graphs TensorFlow builds
    for it (one worker and cfg's ps tasks, in this process): every RunGraph to another task and every
    _Recv whose tensor comes from another task is one call. Asynchronous layouts only (a sync step waits
    for its peers)."""
    import tensorflow as tf  # noqa: PLC0415  (TensorFlow loads where used: launch/ imports it only to measure)
    from ps_trainer.training import graph as train_graph  # noqa: PLC0415  (TensorFlow loads where used: launch/ imports it only to measure)
    v1 = tf.compat.v1
    workers, _ = tf.test.create_local_cluster(num_workers=1, num_ps=len(cfg.cluster.ps_hosts))
    hosts = {job.name: tuple(job.tasks[i] for i in sorted(job.tasks)) for job in workers[0].server_def.cluster.job}
    cluster = dataclasses.replace(cfg.cluster, ps_hosts=hosts["ps"], worker_hosts=hosts["worker"], job_name="worker",
                                  task_index=0)
    with tf.Graph().as_default():
        graph = train_graph.build_graph(dataclasses.replace(cfg, cluster=cluster))
        with v1.Session(workers[0].target) as sess:
            sess.run([v1.global_variables_initializer()])
            sess.run([v1.local_variables_initializer(), v1.tables_initializer()])
            metadata = v1.RunMetadata()
            sess.run(graph.step.train_op, options=v1.RunOptions(output_partition_graphs=True), run_metadata=metadata)
    own = "/job:worker/replica:0/task:0"
    run_graph = sum(not any(node.device.startswith(own) for node in partition.node)
                    for partition in metadata.partition_graphs)
    return RoundTrips(run_graph, cross_task_recvs(metadata), cfg.train.step_path.steps_per_run)


def cross_task_recvs(metadata) -> int:
    """Tensors a session.run pulled from another task (each a RecvTensor call), from the partition
    graphs in its RunMetadata (RunOptions(output_partition_graphs=True)): _Recv, and _HostRecv for the
    tensors that stay in host memory (strings: a dynamic table's IDs)."""
    recv = 0
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op in ("_Recv", "_HostRecv"):
                sender, receiver = (node.attr[name].s.decode() for name in ("send_device", "recv_device"))
                recv += sender.split("/device:")[0] != receiver.split("/device:")[0]
    return recv
