"""Nodes that know only their own address exchange addresses through a shared directory.

Each node writes <root>/<job key>/<node index> (atomically: a temporary file renamed into place)
and waits until every node's file is there. Used for AWS Batch multi-node jobs, whose child nodes
are told only the main node's address.
"""

import os
import pathlib
import socket

from absl import logging

from ps_trainer.cluster.clock import SYSTEM
from ps_trainer.cluster.resolve import ClusterError


class DirectoryRendezvous:
    def __init__(self, root, own_address: str, timeout_secs: float = 600, poll_secs: float = 0.5, clock=SYSTEM):
        self.root = pathlib.Path(root)
        self.clock = clock  # cluster/clock.py
        self.own_address = own_address
        self.timeout_secs = timeout_secs
        self.poll_secs = poll_secs

    def __call__(self, job_key: str, index: int, count: int) -> list[str]:
        folder = self.root / job_key
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".{index}.{os.getpid()}.tmp"
        staging.write_text(self.own_address)
        staging.replace(folder / str(index))
        logging.info("rendezvous: node %d of %d published %s in %s", index, count, self.own_address, folder)
        deadline = self.clock() + self.timeout_secs
        while True:
            present = {i for i in range(count) if (folder / str(i)).exists()}
            if len(present) == count:
                return [(folder / str(i)).read_text().strip() for i in range(count)]
            if self.clock() > deadline:
                missing = sorted(set(range(count)) - present)
                raise ClusterError(
                    f"rendezvous: after {self.timeout_secs:.0f} s nodes {missing} of {count} have not "
                    f"published their address in {folder}; is it a directory shared by every node?")
            self.clock.sleep(self.poll_secs)


def own_address(peer: str | None = None) -> str:
    """This host's address as others see it: the local end of a route toward `peer` (a UDP
    connect sends nothing), else what the host name resolves to."""
    if peer:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))
            return probe.getsockname()[0]
    return socket.gethostbyname(socket.gethostname())
