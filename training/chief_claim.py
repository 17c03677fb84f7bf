"""<model_dir>/chief.json: which chief trains in a model_dir, so that the chief of a second run stops.

Two runs given one --model_dir (a command copied without changing it, a job started again while an
earlier one still runs) write over each other: the second chief resumes from the first's checkpoint,
removes the first's save in progress as unfinished, both save into one list of checkpoints, and the
ps tasks of one exit on the other's done marks. Each can exit 0 (measured: docs/faults.md).

So a chief writes this record (its address, host and pid) before it touches model_dir, and removes
it at its end, whatever the ending but a SIGKILL or a lost host. A chief that finds the record of
another stops with one line (MODEL_DIR_IN_USE, before it waits for any ps) if that chief still runs:
its address still takes connections and, on this host, its pid is alive. It takes the record over
when it is its own earlier life (the same address: a chief restarted by an orchestrator, or a
record left by this very process), or when the other chief is gone. A record of a chief on another
host with no address to probe (a run of one process, or an address on loopback) cannot be checked:
taken over, with a warning naming it.

It is not a lock: two chiefs that start at one moment can both miss the other (not every file
system TensorFlow writes to can create a file only if it is absent). It catches what happens: one
run training, another started later on its model_dir.
"""

import json
import os
import socket
import time

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import peers, spec
from ps_trainer.input import storage
from ps_trainer.training import exit_codes

LOOPBACK_HOSTS = ("localhost", "127.", "[::1]", "::1")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Claim:
    """This chief's record in model_dir; release() removes it if it is still this chief's."""

    def __init__(self, model_dir: str, record: dict):
        self.path, self.record = layout.chief_claim(model_dir), record

    def release(self) -> None:
        try:
            if _read(self.path) == self.record:
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError as err:  # left behind, it names a chief that is gone: the next run takes it over
            logging.warning("could not remove %s: %s", self.path, err)


def claim(model_dir: str, address: str, task_name: str, probe=peers.is_listening, pid_alive=_pid_alive,
          host: str | None = None, pid: int | None = None) -> Claim:
    """Writes this chief's record in model_dir, unless another chief that still runs wrote one:
    then raises a Failure (MODEL_DIR_IN_USE) naming it. `address`: this chief's host:port, or '' for a
    run of one process."""
    host, pid = host or socket.gethostname(), pid or os.getpid()
    path = layout.chief_claim(model_dir)
    other = _read(path)
    if other is not None and not _own(other, address, host, pid):
        running = _still_running(other, host, probe, pid_alive)
        named = _describe(other)
        if running:
            raise exit_codes.Failure(
                f"{task_name}: --model_dir={model_dir} is in use: the chief of another run trains there ({named}); "
                "two runs in one model_dir write over each other's checkpoints. Give this run a --model_dir of its "
                f"own, or stop that one (if nothing runs there, remove {path})", exit_codes.MODEL_DIR_IN_USE)
        if running is None:
            logging.warning("%s: %s names a chief on another host (%s) that cannot be probed; taking the model_dir "
                            "over, as if it had ended", task_name, path, named)
        else:
            logging.info("%s: the chief that last trained in %s (%s) is gone; taking it over", task_name, model_dir,
                         named)
    record = {"address": address, "host": host, "pid": pid, "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    storage.write_whole(path, json.dumps(record))
    return Claim(model_dir, record)


def _read(path: str) -> dict | None:
    try:
        with tf.io.gfile.GFile(path) as f:
            text = f.read()
    except tf.errors.NotFoundError:
        return None
    try:
        record = json.loads(text)
        if isinstance(record, dict) and isinstance(record.get("pid"), int) and isinstance(record.get("host"), str):
            return record
    except ValueError:
        pass
    # Not written by this trainer (cut short by a full disk, edited): it names no chief to wait for.
    logging.warning("%s is not a chief's record; ignoring it", path)
    return None


def _own(record: dict, address: str, host: str, pid: int) -> bool:
    """Whether the record is this chief's earlier life: its address, or this process."""
    return (bool(address) and record.get("address") == address) or (record["host"] == host and record["pid"] == pid)


def _still_running(record: dict, host: str, probe, pid_alive) -> bool | None:
    """Whether the record's chief still runs; None when nothing here can tell."""
    same_host, address = record["host"] == host, record.get("address") or ""
    if same_host and not pid_alive(record["pid"]):
        return False
    if not address:  # a run of one process
        return True if same_host else None
    if not same_host:
        try:
            if spec.split_host_port(address)[0].startswith(LOOPBACK_HOSTS):
                return None  # its loopback is not this host's
        except ValueError:  # not an address
            return None
    return probe(address)


def _describe(record: dict) -> str:
    where = f"at {record['address']}, " if record.get("address") else ""
    return f"{where}pid {record['pid']} on host {record['host']}, since {record.get('since', '?')}"
