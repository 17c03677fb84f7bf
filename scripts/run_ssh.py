#!/usr/bin/env python3
"""Starts a whole cluster over ssh from one machine, collects the logs here, and stops it all.

    python scripts/run_ssh.py --hosts_file=cluster.txt --remote_dir=/srv/ps-trainer \\
        -- --model_dir=/shared/run1 --train_steps=20000

The hosts file lists one task per line, in task order within each job ('#' starts a comment):

    ps      10.0.0.1:2222
    worker  10.0.0.2:2222        # worker 0 is the chief
    worker  10.0.0.3:2222

With --program=FILE (a TF1 Estimator program with `import ps_trainer.estimator` added, its path in
REMOTE_DIR) each task runs the program instead, its role in a TF_CONFIG of its own, and the flags after
'--' are the program's.

Each task runs as 'cd REMOTE_DIR && PYTHON trainer.py ...' on its host, logging to
<run_dir>/<job>-<index>.log here. When the workers are done the ps tasks exit by themselves; on
Ctrl-C or any failure every remote task gets SIGTERM (its ssh session closes) and every local ssh
is stopped by its process group. Hosts must accept key-based ssh (BatchMode: no prompts).
"""

import pathlib
import shlex

from absl import app, flags

from ps_trainer.cluster import spec
from ps_trainer.launch import terminal
from ps_trainer.launch.ssh import SshCluster, read_hosts_file

flags.DEFINE_string("hosts_file", None, "The cluster: lines of 'ps|worker host:port'.", required=True)
flags.DEFINE_string("remote_dir", None, "Directory of ps-trainer on every host.", required=True)
flags.DEFINE_string("python", ".venv/bin/python", "Python on the hosts, relative to --remote_dir or absolute.")
flags.DEFINE_string("ssh", "ssh -o BatchMode=yes -o ConnectTimeout=10", "The ssh command.")
terminal.define_flags("runs/ssh-<timestamp>", timeout_secs=86400, ps_exit_secs=60)
flags.DEFINE_string("program", None, "A TF1 Estimator program (its path in --remote_dir) that every task runs in "
                    "place of trainer.py, told its role by TF_CONFIG; the flags after '--' are its own.")
FLAGS = flags.FLAGS


def main(argv):
    path = pathlib.Path(FLAGS.hosts_file)
    if not path.is_file():
        raise app.UsageError(f"--hosts_file={path} does not exist")
    try:
        jobs = read_hosts_file(path.read_text(), str(path))
    except ValueError as err:
        raise app.UsageError(str(err)) from None
    cluster = SshCluster(terminal.run_dir("ssh-"), jobs[spec.PS], jobs[spec.WORKER], argv[1:],
                         ssh=shlex.split(FLAGS.ssh), remote_dir=FLAGS.remote_dir, python=FLAGS.python,
                         program=FLAGS.program)
    return terminal.launch(cluster, FLAGS.timeout_secs, FLAGS.ps_exit_secs)


if __name__ == "__main__":
    app.run(main)
