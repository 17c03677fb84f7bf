"""The gRPC port has no authentication: refuse cluster addresses the whole internet may reach.

TensorFlow's server listens on every interface, and whoever reaches a task's port can run any op
on its host. A cluster whose addresses are all loopback, private or otherwise not globally routable
is at least not on the open internet by construction; a publicly routable one must be behind a
firewall that admits only the cluster's hosts, which the user states with --allow_public_addresses.
"""

import ipaddress
import socket
from collections.abc import Callable

from absl import logging

from ps_trainer.cluster import spec


def resolve_host(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def public_addresses(cluster: spec.ClusterConfig,
                     resolve: Callable[[str], list[str]] = resolve_host) -> list[str]:
    """The cluster's host:port entries whose host is, or resolves to, a globally routable address.

    A name that does not resolve yet (a pod not started) cannot be judged, and is logged.
    """
    public = []
    joining = (cluster.join_address,) if cluster.joins else ()
    for address in (*cluster.ps_hosts, *cluster.chief_hosts, *cluster.worker_hosts, *joining):
        host, _ = spec.split_host_port(address)
        try:
            ips = [host] if _is_ip(host) else resolve(host)
        except OSError as err:
            logging.warning("cannot check whether %s is a public address: %s", host, err)
            continue
        if any(ipaddress.ip_address(ip.split("%")[0]).is_global for ip in ips):
            public.append(address)
    return public


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def refusal(public: list[str]) -> str:
    return (f"the cluster has publicly routable address(es) {', '.join(public)}: TensorFlow's gRPC port "
            "has no authentication, so anyone who can reach it can run any op on that host. Use private "
            "addresses, or, if a firewall admits only the cluster's own hosts to these ports, pass "
            "--allow_public_addresses.")
