"""Cluster spec and device filters: pure, no server."""

import pytest
from tensorflow.core.protobuf import rewriter_config_pb2

from ps_trainer.cluster import shutdown, spec

pytestmark = pytest.mark.pure

CLUSTER = spec.ClusterConfig(("h0:1", "h1:1"), ("w0:1", "w1:1", "w2:1"), "worker", 2)


def test_cluster_spec_lists_every_task_in_order():
    assert CLUSTER.cluster_spec().as_dict() == {"ps": ["h0:1", "h1:1"], "worker": ["w0:1", "w1:1", "w2:1"]}


def test_worker_sees_every_ps_and_only_itself():
    assert list(spec.session_config(CLUSTER).device_filters) == ["/job:ps", "/job:worker/task:2"]


def test_ps_sees_only_itself():
    ps = spec.ClusterConfig(CLUSTER.ps_hosts, CLUSTER.worker_hosts, "ps", 1)
    assert list(spec.session_config(ps).device_filters) == ["/job:ps/task:1"]


def test_every_session_runs_one_pass_of_the_graph_optimizer_without_the_mlir_round_trip():
    for config in (spec.session_config(CLUSTER), spec.graph_rewrites()):
        rewrites = config.graph_options.rewrite_options
        assert rewrites.meta_optimizer_iterations == rewriter_config_pb2.RewriterConfig.ONE
        assert rewrites.disable_tfg_optimizer and not rewrites.disable_meta_optimizer
    assert spec.session_config(CLUSTER).allow_soft_placement


def test_thread_pools_spin_as_tensorflow_has_them_unless_told_not_to():
    assert not spec.session_config(CLUSTER).experimental.disable_thread_spinning
    sharing = spec.ClusterConfig(CLUSTER.ps_hosts, CLUSTER.worker_hosts, "ps", 0, thread_spinning=False)
    assert spec.session_config(sharing).experimental.disable_thread_spinning


def test_chief_is_worker_zero():
    assert spec.ClusterConfig(("p:1",), ("w:1",), "worker", 0).is_chief
    assert not CLUSTER.is_chief
    assert not spec.ClusterConfig(("p:1",), ("w:1",), "ps", 0).is_chief


@pytest.mark.parametrize("address, parsed", [("10.0.0.1:2222", ("10.0.0.1", 2222)),
                                             ("[::1]:80", ("::1", 80)),
                                             ("ps-0.ns.svc:2222", ("ps-0.ns.svc", 2222))])
def test_split_host_port(address, parsed):
    assert spec.split_host_port(address) == parsed


JOINING = spec.ClusterConfig(("h0:1", "h1:1"), ("w0:1", "w1:1"), "worker", 3, join_address="w3:1")


def test_a_joining_worker_names_the_ps_tasks_and_itself_to_its_sessions():
    config = spec.session_config(JOINING)
    assert list(config.device_filters) == ["/job:ps", "/job:worker/task:3"]
    assert {job.name: dict(job.tasks) for job in config.cluster_def.job} == {
        "ps": {0: "h0:1", 1: "h1:1"}, "worker": {3: "w3:1"}}
    assert config.experimental.share_session_state_in_clusterspec_propagation  # the ps's variables, not copies
    assert (JOINING.replica_index, JOINING.num_replicas, JOINING.own_address()) == (3, 2, "w3:1")
    assert not spec.session_config(CLUSTER).HasField("cluster_def")  # the others' sessions: their server's cluster


def _roll(tmp_path, probe, clock):
    ps = spec.ClusterConfig(("h0:1",), ("w0:1", "w1:1"), "ps", 0)
    return shutdown.Roll(ps, str(tmp_path), 100, gone_secs=10, probe=probe, clock=clock)


def test_the_ps_waits_for_joined_workers_and_not_for_one_gone_once_the_chief_is_done(tmp_path):
    now, serving = [0.0], {"w0:1": True, "w1:1": False, "w2:1": True}
    roll = _roll(tmp_path, lambda address: serving[address], lambda: now[0])
    shutdown.join(str(tmp_path), 2, "w2:1")
    roll.check()
    assert roll.pending() == {0, 1, 2}
    now[0] = 60.0
    roll.check()  # worker 1 serves nothing, but training is not over: a worker may come back
    assert roll.pending() == {0, 1, 2}
    roll.reported(0)
    roll.reported(2)
    roll.check()
    now[0] = 69.0
    roll.check()
    assert roll.pending() == {1}  # refused for 9 s of the 10
    serving["w1:1"] = True  # restarted: it serves again, and the count starts over
    roll.check()
    serving["w1:1"] = False
    now[0] = 75.0
    roll.check()
    now[0] = 84.0
    roll.check()
    assert roll.pending() == {1}
    now[0] = 85.0
    roll.check()
    assert roll.pending() == set() and roll.gone == {1}


def test_a_joined_worker_that_reported_before_its_record_was_read_is_not_waited_for(tmp_path):
    roll = _roll(tmp_path, lambda address: True, lambda: 0.0)
    roll.reported(2)
    shutdown.join(str(tmp_path), 2, "w2:1")
    shutdown.mark_done(str(tmp_path), 1, 100, 100)
    roll.check()
    assert roll.pending() == {0}


def test_a_second_joiner_with_the_same_index_is_named_while_the_first_serves(tmp_path):
    shutdown.join(str(tmp_path), 2, "w2:1")
    assert shutdown.held_elsewhere(str(tmp_path), 2, "w9:1", probe=lambda address: True) == "w2:1"
    assert shutdown.held_elsewhere(str(tmp_path), 2, "w9:1", probe=lambda address: False) is None  # it left
    assert shutdown.held_elsewhere(str(tmp_path), 2, "w2:1", probe=lambda address: True) is None  # itself, restarted
    assert shutdown.held_elsewhere(str(tmp_path), 3, "w9:1", probe=lambda address: True) is None


def test_a_ps_ends_on_its_chiefs_failure_mark_but_not_on_an_earlier_runs_nor_after_the_chief_finished(tmp_path):
    model_dir = str(tmp_path)
    shutdown.mark_chief_failed(model_dir, "worker:0: an earlier run's bad record")
    roll = _roll(tmp_path, lambda address: True, lambda: 0.0)
    roll.check()
    assert not roll.over() and roll.chief_failed is None  # there when the ps began: an earlier run's
    shutdown.mark_chief_failed(model_dir, "worker:0: bad input record: /data/train-00.csv record 7")
    roll.check()
    assert roll.over() and roll.chief_failed == "worker:0: bad input record: /data/train-00.csv record 7"
    assert roll.pending() == {0, 1}  # it ends unfinished

    shutdown.clear_chief_failed(model_dir)  # this run's chief begins
    roll = _roll(tmp_path, lambda address: True, lambda: 0.0)
    shutdown.mark_done(model_dir, 0, 100, 100)
    shutdown.mark_chief_failed(model_dir, "worker:0: its export failed")  # after its done mark
    roll.check()
    assert roll.chief_failed is None and roll.pending() == {1}


def test_a_ps_ends_on_a_failure_mark_from_before_it_began_once_the_chief_stays_silent_for_the_startup_timeout(
        tmp_path):
    model_dir = str(tmp_path)
    shutdown.mark_chief_failed(model_dir, "worker:0: --batch_size must be positive")  # refused before the ps began
    now, serving = [0.0], {"w0:1": False, "w1:1": True}
    ps = spec.ClusterConfig(("h0:1",), ("w0:1", "w1:1"), "ps", 0)
    roll = shutdown.Roll(ps, model_dir, 100, gone_secs=10, probe=lambda address: serving[address],
                         clock=lambda: now[0], chief_start_secs=30)

    def checked_at(*times):
        for time in times:
            now[0] = time
            roll.check()

    checked_at(0.0, 29.0)
    assert not roll.over()  # a chief may still be starting: it would remove the mark as it begins
    serving["w0:1"] = True  # it serves (and has not yet removed the mark): the count starts over
    checked_at(40.0)
    serving["w0:1"] = False
    checked_at(45.0, 74.0)
    assert not roll.over()
    checked_at(75.0)
    assert roll.over() and roll.chief_failed == "worker:0: --batch_size must be positive"

    shutdown.mark_chief_failed(model_dir, "worker:0: an earlier run's bad record")
    roll = shutdown.Roll(ps, model_dir, 100, probe=lambda address: False, clock=lambda: now[0], chief_start_secs=30)
    roll.check()
    shutdown.clear_chief_failed(model_dir)  # this run's chief began, and its server is not up yet
    now[0] = 200.0
    roll.check()
    assert not roll.over() and roll.chief_failed is None
