"""Hosts on one machine: network namespaces on a bridge, each with its own address and, optionally, an
egress rate limit (tc's token bucket filter) standing in for a network link of that speed.

Used by the multi-host tests and by scripts/plan_cluster.py --check. Needs root and iproute2.
"""

import ctypes
import os
import subprocess

SUBNET = "10.123.0"
ROUTER = f"{SUBNET}.254"
CLONE_NEWNET = 0x40000000  # <sched.h>: setns()'s kind of namespace


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """Namespaces '<prefix>sw' (a bridge) and '<prefix>h<i>' (10.123.0.<i+1>), removed at close.
    rate_mbit: each host's sending rate, in Mbit/s (None: the veth's own speed)."""

    def __init__(self, count, router=False, rate_mbit: float | None = None):
        self.prefix = f"pst{os.getpid() % 100000}"
        self.switch = f"{self.prefix}sw"
        self.names = []
        ip("netns", "add", self.switch)
        self.created = [self.switch]
        try:
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(count + int(router)):
                name = f"{self.prefix}h{i}"
                address = ROUTER if router and i == count else f"{SUBNET}.{i + 1}"
                ip("netns", "add", name)
                self.created.append(name)
                ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
                ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
                ip("-n", name, "link", "set", "eth0", "up")
                ip("-n", name, "link", "set", "lo", "up")
                if rate_mbit:  # what leaves the host, queued up to 50 ms, as a NIC of that speed would
                    subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                                    "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "50ms"],
                                   check=True, capture_output=True, timeout=30)
                self.names.append(name)
        except BaseException:
            self.close()
            raise
        self.router = self.names.pop() if router else None

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def close(self):
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self.created = []


def start_in(namespace, argv, env, log=None) -> subprocess.Popen:
    """argv inside a host's namespace, in a process group of its own (stopped by that group's id)."""
    return subprocess.Popen(["ip", "netns", "exec", namespace, *argv], env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, text=True)


def enter(namespace) -> None:
    """Moves this process into a host's network namespace, as `ip netns exec` does before it runs its command
    (without its remount of /sys, which nothing here reads). Call it while the process has one thread: the
    threads made after it are in the namespace too."""
    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {namespace}: {os.strerror(error)}")
    finally:
        os.close(fd)
