"""Cluster spec and device filters: pure, no server."""

import pytest

from cluster import spec

pytestmark = pytest.mark.pure

CLUSTER = spec.ClusterConfig(("h0:1", "h1:1"), ("w0:1", "w1:1", "w2:1"), "worker", 2)


def test_cluster_spec_lists_every_task_in_order():
    assert CLUSTER.cluster_spec().as_dict() == {"ps": ["h0:1", "h1:1"], "worker": ["w0:1", "w1:1", "w2:1"]}


def test_worker_sees_every_ps_and_only_itself():
    assert list(spec.session_config(CLUSTER).device_filters) == ["/job:ps", "/job:worker/task:2"]


def test_ps_sees_only_itself():
    ps = spec.ClusterConfig(CLUSTER.ps_hosts, CLUSTER.worker_hosts, "ps", 1)
    assert list(spec.session_config(ps).device_filters) == ["/job:ps/task:1"]


def test_chief_is_worker_zero():
    assert spec.ClusterConfig(("p:1",), ("w:1",), "worker", 0).is_chief
    assert not CLUSTER.is_chief
    assert not spec.ClusterConfig(("p:1",), ("w:1",), "ps", 0).is_chief


@pytest.mark.parametrize("address, parsed", [("10.0.0.1:2222", ("10.0.0.1", 2222)),
                                             ("[::1]:80", ("::1", 80)),
                                             ("ps-0.ns.svc:2222", ("ps-0.ns.svc", 2222))])
def test_split_host_port(address, parsed):
    assert spec.split_host_port(address) == parsed
