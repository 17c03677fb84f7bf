"""Before a task starts its server: is its address in the cluster one of this host's, and is the port free?

Two start-up mistakes end otherwise in a traceback far from their cause: a port already in use
(TensorFlow says only "Could not start gRPC server"), and the classic copy-paste of one command
line to every host, the same --task_index everywhere, where each host would serve some other
host's address, or wait for itself.
"""

import errno
import socket
from collections.abc import Callable

from absl import logging

from ps_trainer.cluster import guard, spec


def problem(cluster: spec.ClusterConfig, resolve: Callable[[str], list[str]] = guard.resolve_host) -> str | None:
    """One line saying what is wrong with this task's own address, or None."""
    address = cluster.own_address()
    host, port = spec.split_host_port(address)
    try:
        ips = resolve(host)
    except OSError as err:
        logging.warning("%s: cannot resolve its own host %s (%s); not checking that it is this host", cluster.task_name,
                        host, err)
        ips = None
    if ips is not None and all(_bind_error(ip, 0) for ip in ips):
        resolved = "" if ips == [host] else f" ({', '.join(ips)})"
        return (f"this task is {cluster.task_name}, whose address in the cluster is {address}, but {host}"
                f"{resolved} is not an address of this host ({socket.gethostname()}): was every host "
                "started with the same --task_index? Each host runs the task at its own address (behind NAT "
                "or a proxy, pass --skip_own_address_check)")
    if _bind_error("", port) == errno.EADDRINUSE:
        return (f"port {port} of this task's address {address} ({cluster.task_name}) is in use on this host: "
                f"another process listens there (a task of an earlier run? `ss -ltnp 'sport = :{port}'` names it)")
    return None


def _bind_error(ip: str, port: int) -> int | None:
    """The errno of binding ip:port here (EADDRNOTAVAIL: not this host's; EADDRINUSE: taken), or None."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: a port in TIME_WAIT is free
            sock.bind((ip.split("%")[0], port))
    except OSError as err:  # an address family this host lacks counts as not this host's
        return err.errno or -1
    return None
