"""The SSH cluster: each task runs on the host of its address through a local ssh process, and the
hosts file that lists them.

A remote task runs under a watchdog that sends it SIGTERM when its ssh session's standard input
closes, so stopping the local ssh (by its process group, as every task is stopped) stops the remote
trainer too.
"""

import shlex
import subprocess

from ps_trainer.cluster import spec
from ps_trainer.launch.processes import ProcessCluster


class SshCluster(ProcessCluster):
    """ssh: the command, e.g. ['ssh', '-o', 'BatchMode=yes']; each task runs in remote_dir there.
    `program`: a user's TF1 Estimator program (its path in remote_dir) run in place of trainer.py, its task
    given by a TF_CONFIG set in the remote command (worker 0 is the chief, as trainer.py's is)."""

    stdin = subprocess.PIPE

    def __init__(self, run_dir, ps_hosts, worker_hosts, trainer_args=(), ssh=("ssh",), remote_dir=".",
                 python="python3", env=None, program=None):
        super().__init__(run_dir, ps_hosts, worker_hosts, trainer_args, env=env, python=python,
                         tf_config=bool(program), program=program)
        self.ssh, self.remote_dir = list(ssh), remote_dir

    def command(self, job: str, index: int, extra_args=(), trainer: str = "trainer.py") -> list[str]:
        argv = super().command(job, index, extra_args, trainer=self.program or trainer)
        if self.program:  # the local environment stays here: the remote task's TF_CONFIG goes in its command
            argv = ["env", f"TF_CONFIG={self.task_env(job, index)['TF_CONFIG']}", *argv]
        # The trainer in the background, a watchdog that sends it SIGTERM when the session's stdin
        # closes (passed on fd 3: bash gives background jobs /dev/null), and the trainer's exit code
        # as the session's.
        script = (f"cd {shlex.quote(self.remote_dir)} && exec 3<&0 && {{ {shlex.join(argv)} <&- & "
                  "child=$!; ( while read -r _ <&3; do :; done; kill -TERM $child 2>/dev/null ) & "
                  "watchdog=$!; wait $child; code=$?; kill $watchdog 2>/dev/null; exit $code; }")
        host = self.address(job, index).rpartition(":")[0].strip("[]")
        return [*self.ssh, host, script]


def read_hosts_file(text: str, path: str = "hosts file") -> dict[str, list[str]]:
    """'ps|worker host:port' lines, in task order -> {'ps': [...], 'worker': [...]}.

    Raises ValueError naming the file and line at fault.
    """
    jobs = {"ps": [], "worker": []}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or fields[0] not in jobs:
            raise ValueError(f"{path}:{number}: expected 'ps host:port' or 'worker host:port', got {raw!r}")
        try:
            spec.split_host_port(fields[1])
        except ValueError as err:
            raise ValueError(f"{path}:{number}: {err}") from None
        jobs[fields[0]].append(fields[1])
    if not jobs["ps"] or not jobs["worker"]:
        raise ValueError(f"{path}: needs at least one ps line and one worker line")
    return jobs
