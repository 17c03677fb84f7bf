"""A real Slurm (Debian's slurm-wlm and munge): the fixture writes a slurm.conf, starts munged,
slurmctld and slurmd on this host, and stops them by their process groups. The batch script the
project ships is submitted as a user would, and judged by what Slurm records for the job.

Skipped, saying why, where Slurm is not installed (.ci/run installs it).
"""

import contextlib
import os
import pathlib
import random
import re
import shutil
import socket
import subprocess
import sys
import time

import portpicker
import pytest
import tensorflow as tf

from ps_trainer.launch import processes
from tests.support import ROOT, SCRIPTS, stop_process_group, wait_for
from ps_trainer.training import log_lines

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]  # one real Slurm at a time
DAEMONS = ("munged", "slurmctld", "slurmd")


class Slurm:
    """One controller and one node (this host, 4 CPUs by configuration) with its own munge."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.procs = []
        (root / "state").mkdir()
        (root / "spool").mkdir()
        munge = root / "munge"
        munge.mkdir(mode=0o711)
        (munge / "munge.key").write_bytes(os.urandom(1024))
        (munge / "munge.key").chmod(0o400)
        self.socket = munge / "munge.socket"
        node = socket.gethostname().split(".")[0]  # slurmd takes its node name from the host name
        ctld_port, node_port = processes.free_ports(2)
        (root / "slurm.conf").write_text("\n".join([
            "ClusterName=pstrainer", f"SlurmctldHost={node}(127.0.0.1)", f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_port}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            f"AuthInfo=socket={self.socket}", "CredType=cred/munge", f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}", f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}", f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/builtin", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "SlurmdParameters=config_overrides",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={root / 'jobcomp.txt'}",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            # MinJobAge: sbatch --wait polls every 2 s while that is under half of it (else 2, 10, 42 s...).
            "KillWait=30", "MinJobAge=4",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))

    def start(self):
        self._daemon("munged", ["-F", "--force", f"--socket={self.socket}",
                                f"--key-file={self.socket.parent / 'munge.key'}",
                                f"--log-file={self.root / 'munged.log'}",
                                f"--pid-file={self.root / 'munged.pid'}", f"--seed-file={self.root / 'munged.seed'}"])
        self._daemon("slurmctld", ["-D", "-i"])
        self._daemon("slurmd", ["-D"])
        def idle():
            assert all(proc.poll() is None for proc in self.procs), f"a daemon exited:\n{self.logs()}"
            return self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle"

        wait_for(idle, 60, "the node to come up idle")

    def _daemon(self, name, args):
        log = open(self.root / f"{name}.out", "w")
        self.procs.append(subprocess.Popen([shutil.which(name), *args], env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True))

    def run(self, *argv, timeout=60, **options) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, **options)

    def job_record(self, job_id: str) -> dict:
        """The job's line in the job completion log (written when it ends), as key=value pairs."""
        path = self.root / "jobcomp.txt"
        lines = [line for line in (path.read_text() if path.exists() else "").splitlines()
                 if line.startswith(f"JobId={job_id} ")]
        return dict(re.findall(r"(\w+)=(\S*)", lines[-1])) if lines else {}

    def wait_until_gone(self, job_id: str, timeout: float) -> dict:
        """Its record, once the job has ended and left the queue: a cancelled job is recorded at once,
        and stays in the queue, completing, until every one of its processes has ended."""
        wait_for(lambda: self.job_record(job_id) and not self.run("squeue", "-h", "-j", job_id).stdout.strip(),
                 timeout, f"job {job_id} to end and leave the queue")
        return self.job_record(job_id)

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-1500:]}" for path in sorted(self.root.glob("*.out")))

    def stop(self):
        """Every job cancelled and gone (its tasks run under slurmstepd, outside the daemons' process
        groups), then every daemon, by its process group."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--user=root", timeout=30)
            wait_for(lambda: not self.run("squeue", "-h", timeout=30).stdout.strip(), 60,
                     "every job to leave the queue")
        for proc in reversed(self.procs):
            stop_process_group(proc, grace_secs=30)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [name for name in (*DAEMONS, "sbatch", "scancel", "sinfo") if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): Debian's slurm-wlm and munge")
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def free_port_block(count: int) -> int:
    """A port p with p..p+count-1 all free: the batch script's tasks listen on PORT + local task id."""
    for _ in range(200):
        ports = processes.port_range()
        base = random.randrange(ports.start, ports.stop - count)
        if all(portpicker.is_port_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no block of free ports")


def submit(slurm, tmp_path, name, *trainer_args, wait=True):
    """sbatch of scripts/slurm/train.sbatch with 3 tasks (1 ps, 2 workers), from the project's
    directory: (sbatch's result, the job id, its log directory)."""
    logs = tmp_path / name
    env = {"PYTHON": sys.executable, "MODEL_DIR": str(tmp_path / "model"), "LOG_DIR": str(logs),
           "PORT": str(free_port_block(3)), "TF_CPP_MIN_LOG_LEVEL": "1"}
    exports = "ALL," + ",".join(f"{key}={value}" for key, value in env.items())
    result = slurm.run("sbatch", "--parsable", *(["--wait"] if wait else []), "--ntasks=3", f"--job-name={name}",
                       f"--output={tmp_path / name}-batch.out", f"--export={exports}",
                       str(SCRIPTS / "slurm" / "train.sbatch"), "--synthetic_examples=2000", "--log_every_n_steps=20",
                       *trainer_args, timeout=300, cwd=ROOT)
    job_id = result.stdout.strip().split(";")[0].splitlines()[0] if result.stdout.strip() else ""
    return result, job_id, logs


def rank_log(logs: pathlib.Path, rank: int) -> str:
    found = list(logs.glob(f"*-rank{rank}.log"))
    return found[0].read_text() if found else ""


def test_a_batch_job_cancelled_checkpoints_its_step_and_resubmitted_resumes_there_and_completes(slurm, tmp_path):
    # The job as a user submits it: 3 tasks, each told its role by Slurm's variables; scancel mid-run, then
    # the same job again, which resumes from the cancelled job's checkpoint and trains to its end.
    _, job_id, logs = submit(slurm, tmp_path, "cancelled", "--train_steps=1000000", "--save_checkpoint_steps=1000000",
                             wait=False)
    def step_40():
        assert not slurm.job_record(job_id), f"the job ended: {slurm.job_record(job_id)}\n{rank_log(logs, 1)[-3000:]}"
        return max((s.step for s in log_lines.steps(rank_log(logs, 1))), default=0) >= 40

    wait_for(step_40, 180, "step 40 of the job")
    for rank, role in ((1, "worker:0"), (2, "worker:1")):
        assert "cluster from Slurm" in rank_log(logs, rank) and f"this task: {role}" in rank_log(logs, rank)
    cancelled_at = time.monotonic()
    assert slurm.run("scancel", job_id).returncode == 0
    record = slurm.wait_until_gone(job_id, timeout=60)
    assert time.monotonic() - cancelled_at < 30 + 15  # within KillWait, the grace period, and a margin
    assert record["JobState"] == "CANCELLED", record
    chief = rank_log(logs, 1)
    for rank in range(3):
        assert "SIGTERM received" in rank_log(logs, rank), rank_log(logs, rank)[-2000:]
    step = int(re.search(r"preempted at global step \d+ \(the chief saved a checkpoint of global step (\d+):",
                         chief).group(1))
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "model"))
    assert tf.train.load_checkpoint(checkpoint).get_tensor("global_step") == step

    result, job_id, logs = submit(slurm, tmp_path, "resumed", f"--train_steps={step + 30}")
    record = slurm.job_record(job_id)
    assert result.returncode == 0, f"{result.stderr}\n{record}\n{rank_log(logs, 1)[-3000:]}"
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", record
    assert "every training replica finished" in rank_log(logs, 0)
    chief = rank_log(logs, 1)
    assert int(log_lines.finished_values(chief)["global_step"]) >= step + 30
    assert tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "model"))).get_tensor(
        "global_step") >= step + 30
    # The checkpoint the cancelled job registered: it holds `step`, though its name can be one less (an
    # async peer's update can land between the save hook's read of the step and the save).
    assert f"Restoring parameters from {checkpoint}" in chief
    # From the cancelled job's step, not from scratch: the job's first step falls within the 30 steps it
    # adds. Whichever worker took it: the other one can start first and train all 30 before the chief's
    # first step (seen: the chief then finished with none of its own).
    first = min(line.step for rank in (1, 2) for line in log_lines.first_steps(rank_log(logs, rank)))
    assert step < first <= step + 30, (step, first)
