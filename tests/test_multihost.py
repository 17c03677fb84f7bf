"""A cluster across hosts: each host a network namespace this test creates, with its own address
on a bridge, and every task inside its host: started by the per-host scripts (the three-host cluster), or
forked from the preloaded trainer into its host (the latency test and the drills that cut links).

The latency variant sends every connection through a router namespace that adds 3 ms each way:
this kernel has no sch_netem for `tc ... netem delay`, so a user-space relay (tests/delay_relay.py)
holds each chunk instead. Skipped, with the reason, where namespaces cannot be created.
"""

import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ps_trainer.launch.forked import TASK_OUTPUT, ForkedTask
from ps_trainer.launch.netns import ROUTER, SUBNET, Hosts, ip, start_in
from tests.support import ROOT, SCRIPTS, finished, run_launcher, wait_for
from ps_trainer.training import exit_codes, log_lines

pytestmark = pytest.mark.e2e
@pytest.fixture
def hosts():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed")
    made = []

    def make(count, router=False):
        try:
            made.append(Hosts(count, router))
        except subprocess.CalledProcessError as err:
            if made or not err.stderr:
                raise
            pytest.skip(f"cannot create network namespaces here: {err.stderr.decode().strip()}")
        return made[-1]

    yield make
    for made_hosts in made:
        made_hosts.close()


def stop(proc, sig=signal.SIGKILL):
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)


def run_cluster(tmp_path, hosts, addresses, extra=()):
    """ps on host 0, workers (0 = chief) on hosts 1 and 2, each by its per-host script."""
    env = {**os.environ, "PYTHON": sys.executable, "LOG_DIR": str(tmp_path / "logs"),
           "PS_HOSTS": addresses[0], "WORKER_HOSTS": ",".join(addresses[1:]),
           "MODEL_DIR": str(tmp_path / "model"), "TF_CPP_MIN_LOG_LEVEL": "1"}
    fast = ["--train_steps=100", "--synthetic_examples=2000", "--log_every_n_steps=50", *extra]
    tasks = [start_in(hosts.names[0], [str(SCRIPTS / "run_ps.sh"), "--task_index=0", *fast], env)]
    tasks += [start_in(hosts.names[i + 1], [str(SCRIPTS / "run_worker.sh"), f"--task_index={i}", *fast], env)
              for i in range(2)]
    try:
        codes = [task.wait(timeout=300) for task in tasks]
    finally:
        for task in tasks:
            stop(task)
    logs = {name: (tmp_path / "logs" / f"{name}.log").read_text() for name in ("ps-0", "worker-0", "worker-1")}
    assert codes == [0, 0, 0], "\n".join(f"--- {k}\n{v[-2000:]}" for k, v in logs.items())
    return logs


def test_a_cluster_across_three_hosts(tmp_path, hosts):
    three = hosts(3)
    addresses = [f"{SUBNET}.{i + 1}:2222" for i in range(3)]
    # Sync rounds: each needs both workers, so worker 1 trains however late a loaded machine starts it
    # (in async mode the chief could reach the last step alone first). 50 rounds are 100 batches.
    logs = run_cluster(tmp_path, three, addresses, extra=["--sync_replicas", "--train_steps=50"])
    assert int(finished(logs["worker-0"])["global_step"]) >= 50
    assert int(finished(logs["worker-1"])["local_steps"]) > 0
    assert "this task: worker:1" in logs["worker-1"] and addresses[0] in logs["worker-1"]


def test_a_cluster_across_hosts_with_3ms_latency(tmp_path, hosts):
    three = hosts(3, router=True)
    # Every task is reached at the router, which relays to the real host 3 ms later each way; each
    # task's server listens on the port of its (router) address inside its own host.
    addresses = [f"{ROUTER}:{3000 + i}" for i in range(3)]
    routes = [f"{ROUTER}:{3000 + i}={SUBNET}.{i + 1}:{3000 + i}" for i in range(3)]
    relay_log = open(tmp_path / "relay.log", "w+")
    relay = start_in(three.router, [sys.executable, str(ROOT / "tests" / "delay_relay.py"), "--delay_ms=3", *routes],
                     dict(os.environ), log=relay_log)
    try:
        # A task's address is the router's, not its own host's: as behind NAT.
        tasks, logs = start_tasks(tmp_path, three, ["--train_steps=100", "--synthetic_examples=2000",
                                                    "--log_every_n_steps=50", "--skip_own_address_check"], addresses)
        logs = finish(tasks, logs)
    finally:
        stop(relay, signal.SIGTERM)
    relay_log.seek(0)
    relayed = int(re.search(r"relayed (\d+) bytes", relay_log.read()).group(1))
    assert relayed > 10 * 2**20  # the variables and gradients of every step crossed the delayed path
    assert int(finished(logs["worker-0"])["global_step"]) >= 100


def max_step(*log_paths: pathlib.Path) -> int:
    """The highest global step the logs name."""
    texts = [path.read_text() if path.exists() else "" for path in log_paths]
    return max((int(step) for text in texts for step in re.findall(r" step (\d+)/\d+ loss", text)), default=0)


def stop_all(tasks):
    for task in tasks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.pid, signal.SIGCONT)  # a paused task takes its SIGKILL too, but say so plainly
        stop(task)


def start_tasks(tmp_path, three, args, addresses=None):
    """ps on host 0, workers 0 (chief) and 1 on hosts 1 and 2 (at `addresses`, by default each host's own):
    trainer.py's tasks as the per-host scripts start them (test_a_cluster_across_three_hosts runs the scripts),
    each forked from the preloaded trainer into its host (ForkedTask), which spares each the 3-4 s of CPU of a
    new Python's `import tensorflow`."""
    addresses = addresses or [f"{SUBNET}.{i + 1}:2222" for i in range(3)]
    (tmp_path / "logs").mkdir()
    cluster = [f"--ps_hosts={addresses[0]}", f"--worker_hosts={','.join(addresses[1:])}",
               f"--model_dir={tmp_path / 'model'}"]
    tasks, logs = [], {}
    for host, (job, index) in enumerate((("ps", 0), ("worker", 0), ("worker", 1))):
        logs[f"{job}-{index}"] = tmp_path / "logs" / f"{job}-{index}.log"
        tasks.append(ForkedTask([str(ROOT / "trainer.py"), f"--job_name={job}", f"--task_index={index}", *cluster,
                                 *args], {**os.environ, **TASK_OUTPUT}, logs[f"{job}-{index}"], cwd=ROOT,
                                netns=three.names[host]))
    return tasks, logs


def wait_for_step(tasks, log_paths, step, secs=240):
    """Until one of the logs names global step `step` (startup and 200 steps take about 15 s alone); fails at
    once if a task exits."""
    def reached():
        assert all(t.poll() is None for t in tasks), f"a task exited before step {step}: {[t.poll() for t in tasks]}"
        return max_step(*log_paths) >= step

    wait_for(reached, secs, f"step {step} in {', '.join(path.name for path in log_paths)}")


def finish(tasks, logs, secs=200):
    """Every task's exit code (each stopped, whatever happens) and every log's text."""
    deadline = time.monotonic() + secs
    try:
        codes = []
        for task in tasks:
            try:
                codes.append(task.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(f"still running after {secs} s")
    finally:
        stop_all(tasks)
    text = {name: path.read_text() if path.exists() else "" for name, path in logs.items()}
    assert codes == [0, 0, 0], "\n".join(f"--- {k}\n{v[-2000:]}" for k, v in text.items())
    return text


@pytest.mark.drill
@pytest.mark.parametrize("host, sync", [(2, True), (0, False)], ids=["worker-link-sync", "ps-link-async"])
def test_a_host_cut_off_for_20_s_heals_without_a_restart(tmp_path, hosts, host, sync):
    """Host 0 runs the ps, hosts 1 and 2 the workers (worker 1 on host 2). Its link goes down for 20 s
    mid-training and comes back: every task carries on and exits 0, none restarted."""
    three = hosts(3)
    # Each cut stops the whole job while it lasts: the sync chief waits for the cut worker's gradients,
    # and no async worker reaches the ps. So 400 steps after it (5-10 s) show it training again, and
    # the job burns no CPU through the cut (an async worker that trained on through a peer's cut
    # needed 6,000 steps to outlast it).
    steps = 600
    tasks, logs = start_tasks(tmp_path, three, [
        f"--train_steps={steps}", "--log_every_n_steps=50", "--synthetic_examples=4000",
        "--stall_warning_secs=5", "--export_saved_model=false", *(["--sync_replicas"] if sync else [])])
    try:
        # Cut once the job trains, read in both workers' logs: each names the global step every 50 of its own
        # steps, and on a loaded machine an async worker's log can trail the job by hundreds of steps.
        workers = [logs["worker-0"], logs["worker-1"]]
        wait_for_step(tasks, workers, 100)
        ip("-n", three.names[host], "link", "set", "eth0", "down")
        cut_at = max_step(*workers)
        # Down until the chief has waited out --stall_warning_secs and said so: the cut has stopped the job.
        wait_for(lambda: "no training step completed for" in logs["worker-0"].read_text(), 120,
                 "the chief's stall warning while the link is down")
        ip("-n", three.names[host], "link", "set", "eth0", "up")
    except BaseException:
        stop_all(tasks)
        raise
    text = finish(tasks, logs)
    for worker in ("worker-0", "worker-1"):
        assert int(finished(text[worker])["global_step"]) >= steps
        assert text[worker].count("first step done") == 1  # one process, one start: nothing restarted
    assert cut_at < steps - 100, "the cut came too late to matter"
    # The chief waited through the cut, said so, and resumed.
    assert "no training step completed for" in text["worker-0"]


@pytest.mark.drill
def test_a_reset_lost_on_the_wire_does_not_stall_a_waiting_worker(tmp_path, hosts):
    """A half-open connection: worker 1 waits (sync) for the chief, which is paused; the ps drops its
    connections to worker 1 while its own link is down, so the resets never arrive. TCP sends
    nothing on the quiet connection: without gRPC keepalive (cluster/spec.py) worker 1 would wait
    for an answer forever. With it, its call fails, its session is re-created, and the job ends."""
    three = hosts(3)
    # Sync: no round completes while worker 1's call hangs, so the steps after the pause (at step 200)
    # are all trained after it recovered, however long that took.
    steps = 400
    tasks, logs = start_tasks(tmp_path, three, [
        f"--train_steps={steps}", "--log_every_n_steps=50", "--synthetic_examples=4000",
        "--export_saved_model=false", "--sync_replicas"])
    try:
        wait_for_step(tasks, [logs["worker-0"]], 200)
        os.killpg(tasks[1].pid, signal.SIGSTOP)  # the chief: worker 1 now waits for its round
        time.sleep(3)  # elapsed time is the subject: worker 1's call to the ps is in flight, waiting for the round
        ip("-n", three.names[0], "link", "set", "eth0", "down")
        killed = subprocess.run(["ip", "netns", "exec", three.names[0], "ss", "-K", "dst", f"{SUBNET}.3"],
                                capture_output=True, text=True, timeout=30)
        ip("-n", three.names[0], "link", "set", "eth0", "up")
        os.killpg(tasks[1].pid, signal.SIGCONT)
    except BaseException:
        stop_all(tasks)
        raise
    text = finish(tasks, logs)
    assert "ESTAB" in killed.stdout, f"no connection to worker 1 was dropped: {killed.stdout} {killed.stderr}"
    for worker in ("worker-0", "worker-1"):
        assert int(finished(text[worker])["global_step"]) >= steps
        assert text[worker].count("first step done") == 1
    assert log_lines.sessions_again(text["worker-1"]), text["worker-1"][-3000:]  # its call failed: a new session


# ---------------------------------------------------------------- a real sshd on every host
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def ssh_hosts(tmp_path, hosts, count):
    """count hosts each running a real sshd on port 22 (root, key-based, keys made here), and one more
    host, the last, for the launcher. Returns the ssh command (a string for --ssh) and the sshds."""
    if not os.path.exists(SSHD):
        pytest.skip("OpenSSH's server (Debian's openssh-server) is not installed")
    made = hosts(count + 1)
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("client", "host"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True,
                       timeout=30)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    sshds = []
    for i in range(count):
        config = keys / f"sshd-{i}.conf"
        config.write_text(f"ListenAddress {SUBNET}.{i + 1}\nPort 22\nHostKey {keys / 'host'}\n"
                          f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile none\nStrictModes no\n"
                          "UsePAM no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                          "KbdInteractiveAuthentication no\n")
        log = open(tmp_path / f"sshd-{i}.log", "w")
        sshds.append(start_in(made.names[i], [SSHD, "-D", "-e", "-f", str(config)], dict(os.environ), log=log))
    ssh = (f"ssh -F /dev/null -i {keys / 'client'} -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=5 "
           "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
    for i in range(count):  # every sshd answers a login before the launcher starts
        def answers(i=i):
            assert sshds[i].poll() is None, (tmp_path / f"sshd-{i}.log").read_text()
            return subprocess.run(["ip", "netns", "exec", made.names[-1], *ssh.split(), f"{SUBNET}.{i + 1}", "true"],
                                  capture_output=True, timeout=30).returncode == 0

        wait_for(answers, 30, f"sshd {i} to answer a login")
    return made, ssh, sshds


def trainers_of(model_dir) -> list[int]:
    """Pids of the trainer processes of this test's run ('python trainer.py ... --model_dir=<it>', as the
    SSH cluster starts them): remote tasks share this machine's processes, so a task sshd left behind
    would be seen here."""
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            if argv[1:2] == [b"trainer.py"] and f"--model_dir={model_dir}".encode() in argv:
                pids.append(int(proc.name))
    return pids


def test_the_ssh_launcher_over_real_sshd_trains_to_the_end_and_ctrl_c_stops_every_remote_task(tmp_path, hosts):
    made, ssh, sshds = ssh_hosts(tmp_path, hosts, 3)
    cluster_file = tmp_path / "cluster.txt"
    cluster_file.write_text(f"ps {SUBNET}.1:2222\nworker {SUBNET}.2:2222\nworker {SUBNET}.3:2222\n")

    def launcher(run, *trainer_args):
        return ["ip", "netns", "exec", made.names[-1], sys.executable, str(SCRIPTS / "run_ssh.py"),
                f"--hosts_file={cluster_file}", f"--remote_dir={ROOT}", f"--python={sys.executable}", f"--ssh={ssh}",
                f"--run_dir={tmp_path / run}", "--", f"--model_dir={tmp_path / run / 'model'}",
                "--synthetic_examples=2000", "--log_every_n_steps=20", *trainer_args]

    try:
        done = run_launcher(launcher("full", "--train_steps=100"), timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert re.search(r"summary: final step 10\d", done.stdout)
        for task in ("ps 0", "worker 0", "worker 1"):
            assert f"{task}: exit 0" in done.stdout
        assert "this task: worker:1" in (tmp_path / "full" / "worker-1.log").read_text()  # collected here

        # Ctrl-C mid-run: the launcher stops every remote task through its ssh session.
        interrupted = subprocess.Popen(launcher("stopped", "--train_steps=1000000"), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            wait_for_step([interrupted], [tmp_path / "stopped" / "worker-0.log"], 40, secs=180)
            assert len(trainers_of(tmp_path / "stopped" / "model")) == 3
            os.kill(interrupted.pid, signal.SIGINT)
            output, _ = interrupted.communicate(timeout=60)
        finally:
            stop(interrupted, signal.SIGTERM)
        assert interrupted.returncode == exit_codes.INTERRUPTED, output[-3000:]
        wait_for(lambda: not trainers_of(tmp_path / "stopped" / "model"), 30,
                 "every remote trainer to end with its ssh session")
    finally:
        for pid in trainers_of(tmp_path / "stopped" / "model"):  # only if the assertion above failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for sshd in sshds:
            stop(sshd, signal.SIGTERM)
