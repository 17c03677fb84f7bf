"""A real cluster of trainer.py processes, each a process of this machine: on 127.0.0.1 for the local
launcher and the tests (LocalCluster), or the base of the SSH cluster (launch/ssh.py).

Every task is a local process in its own process group, logging to <run_dir>/<job>-<index>.log,
and is stopped by that group's id: SIGTERM first, SIGKILL after a grace period. With preload=True a
trainer.py task, or a program's, is forked from a preloaded server (launch/forked.py) instead of
started as a Python of its own.
"""

import contextlib
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import portpicker

from ps_trainer.launch.forked import TASK_OUTPUT, ForkedTask

TRAINER = pathlib.Path(__file__).resolve().parent.parent / "trainer.py"
LOOPBACK = "127.0.0.1"

# Where free_ports looks: below Linux's default range of ephemeral ports (32768-60999), from which
# bind(0) and every outgoing connection take theirs. Picked there (as portpicker does), a port free a
# moment ago can be another process's by the time its task binds it: two processes that pick side by side
# need ranges of their own. PORTS_VARIABLE (FIRST-LAST) narrows it for a process and every launcher it
# starts: two local launchers on one host, or the tests, which give each test process a slice
# (tests/conftest.py).
PORT_RANGE = range(20000, 32768)
PORTS_VARIABLE = "PS_TRAINER_PORTS"
_handed_out: set[int] = set()


def port_range() -> range:
    """The ports free_ports picks from: PORTS_VARIABLE's FIRST-LAST where it is set, else PORT_RANGE."""
    text = os.environ.get(PORTS_VARIABLE, "").strip()
    if not text:
        return PORT_RANGE
    first, dash, last = text.partition("-")
    if not (dash and first.isdigit() and last.isdigit() and 1024 <= int(first) <= int(last) <= 65535):
        raise ValueError(f"{PORTS_VARIABLE}={text!r}: expected FIRST-LAST, two ports from 1024 to 65535")
    return range(int(first), int(last) + 1)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of port_range(), each free (TCP and UDP) a moment ago and, while the range
    lasts, none handed out before by this process."""
    ports = port_range()
    if len(ports) - len(_handed_out.intersection(ports)) < 4 * count:
        _handed_out.clear()
    picked = []
    for port in random.sample(ports, len(ports)):
        if port not in _handed_out and portpicker.is_port_free(port):
            picked.append(port)
            _handed_out.add(port)
            if len(picked) == count:
                return picked
    raise RuntimeError(f"no {count} free ports in {ports.start}-{ports.stop - 1}")


class ProcessCluster:
    """The tasks of a cluster with known hosts, each started as a process of this machine.

    With tf_config=True each task gets its cluster and role from TF_CONFIG, as under Kubeflow,
    instead of flags (an 'evaluator' is listed in TF_CONFIG as Kubeflow does, though it serves nothing).
    """

    stdin = subprocess.DEVNULL  # what a task reads; the SSH cluster gives each a pipe

    def __init__(self, run_dir, ps_hosts, worker_hosts, trainer_args=(), env=None, chief_hosts=(),
                 evaluator_hosts=(), tf_config=False, python=None, preload=False, program=None, evaluator=False):
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ps_hosts, self.worker_hosts = list(ps_hosts), list(worker_hosts)
        self.chief_hosts, self.evaluator_hosts = list(chief_hosts), list(evaluator_hosts)
        self.tf_config = tf_config
        self.python = python or sys.executable
        self.trainer_args = list(trainer_args)
        self.env = {**os.environ, **TASK_OUTPUT, **(env or {})}
        # Variables of one task only ((job, index) -> {name: value}), such as a shifted clock.
        self.env_of_task: dict[tuple[str, int], dict[str, str]] = {}
        self.procs: dict[tuple[str, int], subprocess.Popen | ForkedTask] = {}
        self.preload = preload
        # A user's TF1 program (ps_trainer.estimator) in place of trainer.py: its tasks read TF_CONFIG.
        self.program, self.evaluator = program, evaluator

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()

    def command(self, job: str, index: int, extra_args=(), trainer: str | None = None) -> list[str]:
        trainer = trainer or self.program or str(TRAINER)
        if self.tf_config:
            return [self.python, trainer, *self.trainer_args, *extra_args]
        hosts = [f"--ps_hosts={','.join(self.ps_hosts)}", f"--worker_hosts={','.join(self.worker_hosts)}"]
        if self.chief_hosts:
            hosts.append(f"--chief_hosts={','.join(self.chief_hosts)}")
        return [self.python, trainer, *hosts, f"--job_name={job}", f"--task_index={index}",
                *self.trainer_args, *extra_args]

    def address(self, job: str, index: int) -> str:
        hosts = {"ps": self.ps_hosts, "worker": self.worker_hosts, "chief": self.chief_hosts,
                 "evaluator": self.evaluator_hosts}
        return hosts[job][index]

    def task_env(self, job: str, index: int) -> dict:
        env = {**self.env, **self.env_of_task.get((job, index), {})}
        if not self.tf_config:
            return env
        cluster = {"ps": self.ps_hosts, "worker": self.worker_hosts, "evaluator": self.evaluator_hosts}
        if self.chief_hosts:
            cluster["chief"] = self.chief_hosts
        config = {"cluster": {k: v for k, v in cluster.items() if v}, "task": {"type": job, "index": index},
                  "environment": "cloud"}
        return {**env, "TF_CONFIG": json.dumps(config)}

    def log_path(self, job: str, index: int) -> pathlib.Path:
        return self.run_dir / f"{job}-{index}.log"

    def log(self, job: str, index: int) -> str:
        path = self.log_path(job, index)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, job: str, index: int, extra_args=()) -> subprocess.Popen:
        """Starts (or restarts, once the old one has exited) one task; its log is appended to."""
        old = self.procs.get((job, index))
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{job} {index} is still running (pid {old.pid})")
        command, env = self.command(job, index, extra_args), self.task_env(job, index)
        # A variable of one task (LD_PRELOAD for a shifted clock) acts as its process starts: exec it.
        if (self.preload and command[0] == sys.executable and command[1] in (str(TRAINER), self.program)
                and self.stdin == subprocess.DEVNULL and not self.env_of_task.get((job, index))):
            proc = ForkedTask(command[1:], env, self.log_path(job, index), program=command[1] == self.program)
        else:
            with open(self.log_path(job, index), "ab") as log:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=self.stdin, env=env,
                                        start_new_session=True)
        self.procs[(job, index)] = proc
        return proc

    def start_all(self, extra_args=()) -> None:
        for index in range(len(self.ps_hosts)):
            self.start("ps", index, extra_args)
        if self.chief_hosts:
            self.start("chief", 0, extra_args)
        for index in range(len(self.worker_hosts)):
            self.start("worker", index, extra_args)
        if self.evaluator:
            self.start("evaluator", 0, extra_args)

    def tasks(self, job: str | None = None):
        return [(key, proc) for key, proc in self.procs.items() if job is None or key[0] == job]

    def wait(self, job: str | None = None, timeout: float = 300) -> dict[tuple[str, int], int | None]:
        """Waits up to `timeout` s in all for the tasks of `job`; exit codes, None for still running."""
        deadline = time.monotonic() + timeout
        codes = {}
        for key, proc in self.tasks(job):
            try:
                codes[key] = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[key] = None
        return codes

    def kill(self, job: str, index: int, sig=signal.SIGKILL) -> None:
        proc = self.procs[(job, index)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)

    def stop_all(self, grace_secs: float = 10) -> None:
        """SIGTERM to every live task's process group, then SIGKILL to what is left after grace.

        SIGINT and SIGTERM are held off meanwhile: a second Ctrl-C must not abandon half the tasks.
        """
        held = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self._stop_all(grace_secs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _stop_all(self, grace_secs: float) -> None:
        live = [proc for _, proc in self.tasks() if proc.poll() is None]
        for proc in live:
            if proc.stdin:  # a remote task's watchdog sends it SIGTERM when this closes (launch/ssh.py)
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_secs
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


class SingleProcess(ProcessCluster):
    """trainer.py with no cluster flags, run and stopped like a cluster's task (as "worker 0")."""

    def __init__(self, run_dir, trainer_args):
        super().__init__(run_dir, (), ("",), trainer_args)

    def command(self, job, index, extra_args=(), trainer=str(TRAINER)):
        return [self.python, trainer, *self.trainer_args, *extra_args]


class LocalCluster(ProcessCluster):
    """num_ps ps tasks and num_workers workers (and optionally a chief) on free loopback ports.

    More training tasks than the cores this process may run on: they run with --nothread_spinning (before the
    caller's flags, which can say otherwise), so that no task spin-waits on a core another needs;
    `share_cores=False` leaves that out (a release older than the flag: scripts/compare_releases.py).
    `program`: a user's TF1 program (ps_trainer.estimator) run in place of trainer.py, each task told its
    role by TF_CONFIG (with `chief`: the chief and num_workers workers; with `evaluator`, an evaluator)."""

    def __init__(self, run_dir, num_ps=1, num_workers=2, trainer_args=(), env=None, chief=False,
                 tf_config=False, preload=False, share_cores=True, program=None, evaluator=False):
        ports = free_ports(num_ps + num_workers + 2)
        hosts = [f"{LOOPBACK}:{p}" for p in ports]
        # The cores this process may run on (a container's or taskset's share), not the host's count.
        if share_cores and not program and num_ps + num_workers + int(chief) > len(os.sched_getaffinity(0)):
            trainer_args = ["--nothread_spinning", *trainer_args]
        super().__init__(run_dir, hosts[:num_ps], hosts[num_ps:num_ps + num_workers], trainer_args, env,
                         chief_hosts=[hosts[-2]] if chief else [], evaluator_hosts=[hosts[-1]],
                         tf_config=tf_config or bool(program), preload=preload, program=program,
                         evaluator=evaluator)
