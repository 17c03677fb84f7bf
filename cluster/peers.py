"""Waiting for peer tasks to come up: a bounded, logged retry instead of TensorFlow's own wait.

Session creation waits for every ps task with no deadline at all (the master logs "CreateSession
still waiting for response from worker" every 10 s, forever). A task probes its peers' ports
first, backing off up to MAX_BACKOFF_SECS, naming the missing ones every LOG_EVERY_SECS, and
gives up after a timeout with a message naming them.
"""

import socket

from absl import logging

from ps_trainer.cluster import spec
from ps_trainer.cluster.clock import SYSTEM

FIRST_BACKOFF_SECS = 0.2
MAX_BACKOFF_SECS = 5.0
LOG_EVERY_SECS = 10.0


class PeersUnreachable(Exception):
    pass


def is_listening(address: str, timeout_secs: float = 1.0) -> bool:
    host, port = spec.split_host_port(address)
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_secs):
            return True
    except OSError:
        return False


def wait_for_peers(peers: dict[str, str], timeout_secs: float, task_name: str, probe=is_listening,
                   clock=SYSTEM, timeout_setting: str = "--startup_timeout_secs") -> None:
    """Returns once every peer ({'ps 0': 'host:port'}) accepts connections; raises PeersUnreachable
    naming the missing ones after timeout_secs (timeout_setting: the user's name for it), on `clock`
    (cluster/clock.py)."""
    start = last_log = clock()
    backoff = FIRST_BACKOFF_SECS
    missing = dict(peers)
    while True:
        missing = {name: address for name, address in missing.items() if not probe(address)}
        if not missing:
            if clock() - start >= LOG_EVERY_SECS:
                logging.info("%s: every peer is up after %.0f s", task_name, clock() - start)
            return
        waited = clock() - start
        names = ", ".join(f"{name} at {address}" for name, address in missing.items())
        if waited >= timeout_secs:
            raise PeersUnreachable(
                f"{task_name}: {names} not reachable after {waited:.0f} s ({timeout_setting}="
                f"{timeout_secs:g}); is that task running, and is its port open to this host?")
        if clock() - last_log >= LOG_EVERY_SECS or last_log == start:
            logging.info("%s: waiting for %s (retrying for up to %.0f s more)", task_name, names,
                         timeout_secs - waited)
            last_log = clock()
        clock.sleep(min(backoff, max(0.0, timeout_secs - waited)))
        backoff = min(backoff * 2, MAX_BACKOFF_SECS)
