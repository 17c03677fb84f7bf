"""Cluster spec, device filters and free ports: pure, no server."""

import pytest

from cluster import local, spec

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


def test_free_ports_are_distinct():
    ports = local.free_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= p <= 65535 for p in ports)


def test_log_times_across_new_year_keep_their_order():
    import datetime

    from cluster import launch
    now = datetime.datetime(2027, 1, 1, 0, 0, 30)
    before = launch.log_time("I1231 23:59:50.000000 1 hooks.py:125] worker:0 step 10/20", now)
    after = launch.log_time("I0101 00:00:10.500000 1 hooks.py:125] worker:0 step 20/20", now)
    assert before.year == 2026 and after.year == 2027
    assert (after - before).total_seconds() == 20.5
