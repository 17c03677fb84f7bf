"""What the project ships for each engine: the SSH launcher (end to end with a local stand-in for ssh;
against real sshds in tests/test_multihost.py), its hosts file, and the Slurm batch script."""

import re
import subprocess
import sys

import portpicker
import pytest

from ps_trainer.launch import processes
from ps_trainer.launch.processes import free_ports
from ps_trainer.launch.ssh import read_hosts_file
from tests.support import ROOT, SCRIPTS, run_launcher


@pytest.mark.pure
def test_hosts_file_lists_tasks_in_order():
    jobs = read_hosts_file("# cluster\nps 10.0.0.1:2222\nworker 10.0.0.2:2222  # chief\n"
                                   "worker 10.0.0.3:2222\n")
    assert jobs == {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}


@pytest.mark.inprocess
def test_free_ports_are_free_distinct_and_out_of_the_range_outgoing_connections_take_theirs_from():
    first, second = free_ports(6), free_ports(6)
    assert len(set(first + second)) == 12
    assert all(port in processes.PORT_RANGE and port < 32768 and portpicker.is_port_free(port)
               for port in first + second)


@pytest.mark.inprocess
def test_ps_trainer_ports_narrows_the_ports_a_launcher_picks_and_a_bad_value_is_named(monkeypatch):
    # What each test process hands the launchers it starts (tests/conftest.py), so that theirs and the other
    # test process's never meet; and what a user sets to run two local launchers side by side.
    monkeypatch.setenv(processes.PORTS_VARIABLE, "21000-21099")
    assert processes.port_range() == range(21000, 21100)
    assert all(21000 <= port <= 21099 for port in free_ports(8))
    for bad in ("21000", "21099-21000", "80-90", "a-b"):
        monkeypatch.setenv(processes.PORTS_VARIABLE, bad)
        with pytest.raises(ValueError, match=rf"^PS_TRAINER_PORTS='{bad}': expected FIRST-LAST, two ports"):
            free_ports(1)


@pytest.mark.parametrize("text, message", [
    ("ps 10.0.0.1:2222\nchief 10.0.0.2:2222\n", "cluster.txt:2: expected 'ps host:port'"),
    ("ps 10.0.0.1\nworker 10.0.0.2:2222\n", "cluster.txt:1: '10.0.0.1' is not host:port"),
    ("ps 10.0.0.1:2222\n", "needs at least one ps line and one worker line"),
])
@pytest.mark.pure
def test_bad_hosts_file_names_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        read_hosts_file(text, "cluster.txt")


def run_ssh_launcher(tmp_path, *args):
    """scripts/run_ssh.py over 1 ps and 2 workers on 127.0.0.1, through a local stand-in for ssh that runs
    each remote command here; its logs in tmp_path/logs."""
    ps, w0, w1 = free_ports(3)
    hosts = tmp_path / "cluster.txt"
    hosts.write_text(f"ps 127.0.0.1:{ps}\nworker 127.0.0.1:{w0}\nworker 127.0.0.1:{w1}\n")
    return run_launcher(
        [sys.executable, str(SCRIPTS / "run_ssh.py"), f"--hosts_file={hosts}", f"--remote_dir={ROOT}",
         f"--python={sys.executable}", f"--ssh={ROOT / 'tests' / 'fake_ssh.sh'}", f"--run_dir={tmp_path / 'logs'}",
         *args], timeout=240)


@pytest.mark.e2e
def test_ssh_launcher_runs_the_cluster_and_collects_logs_here(tmp_path):
    # The real sshd test (tests/test_multihost.py) needs network namespaces; this one, with a local
    # stand-in for ssh, runs the launcher's remote command on any machine.
    result = run_ssh_launcher(tmp_path, "--", f"--model_dir={tmp_path / 'model'}", "--train_steps=100",
                              "--synthetic_examples=2000")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert re.search(r"summary: final step 10\d", result.stdout)
    for task in ("ps 0", "worker 0", "worker 1"):
        assert f"{task}: exit 0" in result.stdout
    assert "every training replica finished" in (tmp_path / "logs" / "ps-0.log").read_text()


@pytest.mark.e2e
def test_ssh_launcher_runs_a_tf1_program_on_every_host_each_told_its_role_by_tf_config(tmp_path):
    result = run_ssh_launcher(tmp_path, "--program=tests/programs/clicks_estimator.py", "--",
                              f"--model_dir={tmp_path / 'model'}", "--train_steps=200")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for task in ("ps 0", "worker 0", "worker 1"):
        assert f"{task}: exit 0" in result.stdout
    chief, other = ((tmp_path / "logs" / f"worker-{index}.log").read_text() for index in (0, 1))
    # Each ran the program as the task TF_CONFIG named and stopped at the last step; the chief, which trains
    # from the first step, logged TF1's loss line (a worker that starts late may take no step of its own).
    for index, log in enumerate((chief, other)):
        finished = re.search(rf"worker:{index} finished: global_step=(\d+)", log)
        assert finished and int(finished.group(1)) >= 200, log[-2000:]
    assert re.search(r"loss = [^,]+, step = \d+", chief), chief[-2000:]
    assert tf_checkpoint_step(tmp_path / "model") >= 200


def tf_checkpoint_step(model_dir) -> int:
    """The global step in the name of model_dir's newest checkpoint."""
    state = (model_dir / "checkpoint").read_text()
    return int(re.search(r'model_checkpoint_path: ".*-(\d+)"', state).group(1))


@pytest.mark.e2e
def test_slurm_script_starts_every_task_in_one_block_distributed_step():
    script = (SCRIPTS / "slurm" / "train.sbatch").read_text()
    srun = [line.strip() for line in script.splitlines() if line.strip().startswith("srun")]
    assert len(srun) == 2  # trainer.py's, and a PROGRAM's
    assert all("--distribution=block" in line and "--kill-on-bad-exit=1" in line for line in srun)
    assert subprocess.run(["bash", "-n", str(SCRIPTS / "slurm" / "train.sbatch")]).returncode == 0
