"""The cluster resolver, fed the environment strings each engine really sets. Pure: no process."""

import json
import threading

import pytest

from ps_trainer.cluster import rendezvous, spec
from ps_trainer.cluster.resolve import (
    ClusterError,
    ResolveOptions,
    expand_nodelist,
    expand_tasks_per_node,
    from_tf_config,
    resolve,
)
from tests.support import FakeClock

pytestmark = pytest.mark.pure

# Kubeflow training operator v1.9: <job>-<type>-<i>.<namespace>.svc:<port>, evaluator in 'cluster'.
TFJOB_CLUSTER = {
    "chief": ["mnist-chief-0.team.svc:2222"],
    "evaluator": ["mnist-evaluator-0.team.svc:2222"],
    "ps": ["mnist-ps-0.team.svc:2222", "mnist-ps-1.team.svc:2222"],
    "worker": ["mnist-worker-0.team.svc:2222", "mnist-worker-1.team.svc:2222"],
}


def tfjob_env(task_type, index):
    config = {"cluster": TFJOB_CLUSTER, "task": {"type": task_type, "index": index}, "environment": "cloud"}
    return {"TF_CONFIG": json.dumps(config, separators=(",", ":"))}


def test_tfjob_chief_is_the_chief_and_first_replica():
    resolved = resolve(None, tfjob_env("chief", 0))
    cluster = resolved.cluster
    assert resolved.source == "TF_CONFIG"
    assert (cluster.job_name, cluster.task_index, cluster.is_chief, cluster.replica_index) == ("chief", 0, True, 0)
    assert cluster.num_replicas == 3 and cluster.num_ps == 2
    assert cluster.worker_device() == "/job:chief/task:0"
    assert cluster.cluster_spec().as_dict() == {
        "ps": TFJOB_CLUSTER["ps"], "worker": TFJOB_CLUSTER["worker"], "chief": TFJOB_CLUSTER["chief"]}


def test_tfjob_worker_is_not_chief_and_sees_only_ps_and_itself():
    cluster = resolve(None, tfjob_env("worker", 1)).cluster
    assert (cluster.job_name, cluster.task_index, cluster.is_chief, cluster.replica_index) == ("worker", 1, False, 2)
    assert list(spec.session_config(cluster).device_filters) == ["/job:ps", "/job:worker/task:1"]


def test_tfjob_ps_and_evaluator():
    ps = resolve(None, tfjob_env("ps", 1)).cluster
    assert (ps.job_name, ps.task_index, ps.is_chief, ps.own_address()) == ("ps", 1, False, "mnist-ps-1.team.svc:2222")
    evaluator = resolve(None, tfjob_env("evaluator", 0)).cluster
    assert evaluator.job_name == "evaluator" and not evaluator.is_distributed and not evaluator.is_chief
    # The evaluator is never part of the training cluster spec, so nobody can wait for it.
    assert "evaluator" not in evaluator.cluster_spec().jobs


def test_one_replica_tfjob_sets_no_tf_config_and_trains_in_one_process():
    resolved = resolve(None, {"HOSTNAME": "mnist-worker-0"})
    assert resolved.cluster == spec.ClusterConfig() and resolved.cluster.is_chief


def test_without_a_chief_worker_zero_is_chief():
    env = {"TF_CONFIG": json.dumps({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"]},
                                    "task": {"type": "worker", "index": 0}})}
    cluster = resolve(None, env).cluster
    assert cluster.is_chief and cluster.replica_index == 0 and cluster.num_replicas == 2


# SageMaker's TensorFlow toolkit, parameter-server mode, two hosts: it starts the ps itself (2223).
SAGEMAKER_TF_CONFIG = {"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                                   "worker": ["algo-2:2222"]},
                       "environment": "cloud", "task": {"index": 0, "type": "master"}}


def test_sagemaker_master_from_its_tf_config_is_the_chief():
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1",
           "TF_CONFIG": json.dumps(SAGEMAKER_TF_CONFIG)}
    resolved = resolve(None, env)
    cluster = resolved.cluster
    assert resolved.source == "TF_CONFIG (SageMaker)"
    assert (cluster.job_name, cluster.chief_job, cluster.is_chief) == ("master", "master", True)
    assert cluster.cluster_spec().as_dict()["master"] == ["algo-1:2222"]
    assert cluster.worker_device() == "/job:master/task:0"


@pytest.mark.parametrize("host, job, index", [("algo-1", "master", 0), ("algo-2", "worker", 0),
                                               ("algo-3", "worker", 1)])
def test_sagemaker_hosts_without_tf_config(host, job, index):
    env = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_CURRENT_HOST": host}
    cluster = resolve(None, env).cluster
    assert (cluster.job_name, cluster.task_index) == (job, index)
    assert cluster.ps_hosts == ("algo-1:2223", "algo-2:2223", "algo-3:2223")
    assert cluster.chief_hosts == ("algo-1:2222",) and cluster.worker_hosts == ("algo-2:2222", "algo-3:2222")


def test_one_host_sagemaker_job_trains_in_one_process():
    env = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1",
           "TF_CONFIG": json.dumps({"cluster": {"master": ["algo-1:2222"]}, "environment": "cloud",
                                    "task": {"index": 0, "type": "master"}})}
    assert not resolve(None, env).cluster.is_distributed


@pytest.mark.parametrize("text, hosts", [
    ("node[9-10]", ["node9", "node10"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("gpu[1,3-4],cpu7", ["gpu1", "gpu3", "gpu4", "cpu7"]),
    ("a-[2-3]-x,b1", ["a-2-x", "a-3-x", "b1"]),
    ("solo", ["solo"]),
])
def test_slurm_node_lists_expand_in_slurm_order(text, hosts):
    assert expand_nodelist(text) == hosts


def test_slurm_tasks_per_node():
    assert expand_tasks_per_node("3(x2),1") == [3, 3, 1]
    assert expand_tasks_per_node("2") == [2]


def slurm_env(rank, node, local, nodelist="node[9-10]", tasks="2(x2)", ntasks=4):
    return {"SLURM_JOB_NODELIST": nodelist, "SLURM_TASKS_PER_NODE": tasks, "SLURM_NTASKS": str(ntasks),
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": node}


def test_slurm_two_digit_node_names_resolve_to_their_own_addresses():
    resolved = resolve(None, slurm_env(rank=2, node="node10", local=0), ResolveOptions(num_ps=1, port=8000))
    cluster = resolved.cluster
    assert resolved.source == "Slurm"
    # String sorting would put node10 first and hand rank 2 node9's address.
    assert cluster.ps_hosts == ("node9:8000",)
    assert cluster.worker_hosts == ("node9:8001", "node10:8000", "node10:8001")
    assert (cluster.job_name, cluster.task_index, cluster.own_address()) == ("worker", 1, "node10:8000")


def test_slurm_uneven_tasks_per_node():
    env = slurm_env(rank=6, node="n3", local=0, nodelist="n[1-3]", tasks="3(x2),1", ntasks=7)
    cluster = resolve(None, env, ResolveOptions(num_ps=2)).cluster
    assert cluster.ps_hosts == ("n1:2222", "n1:2223")
    assert (cluster.job_name, cluster.task_index, cluster.own_address()) == ("worker", 4, "n3:2222")


def test_slurm_rank_on_the_wrong_node_is_refused():
    with pytest.raises(ClusterError, match="should run on node10 .* but runs on node9"):
        resolve(None, slurm_env(rank=2, node="node9", local=0))


def test_a_one_task_slurm_step_is_not_a_cluster():
    env = {**slurm_env(rank=0, node="node9", local=0, tasks="1", nodelist="node9"), "SLURM_NTASKS": "1"}
    assert not resolve(None, env).cluster.is_distributed


def batch_env(index, main_ip=None):
    env = {"AWS_BATCH_JOB_ID": f"4f1e-job#{index}", "AWS_BATCH_JOB_NODE_INDEX": str(index),
           "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"}
    if main_ip:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_ip
    return env


def test_aws_batch_nodes_rendezvous_and_agree_on_the_cluster(tmp_path):
    results = {}

    def node(index):
        meet = rendezvous.DirectoryRendezvous(tmp_path, f"172.31.0.{10 + index}", timeout_secs=20, poll_secs=0.05)
        env = batch_env(index, main_ip=None if index == 0 else "172.31.0.10")
        results[index] = resolve(None, env, ResolveOptions(num_ps=1, port=2222, rendezvous=meet)).cluster

    threads = [threading.Thread(target=node, args=(i,)) for i in (2, 0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [0, 1, 2]
    for cluster in results.values():
        assert cluster.ps_hosts == ("172.31.0.10:2222",)
        assert cluster.worker_hosts == ("172.31.0.11:2222", "172.31.0.12:2222")
    assert [(c.job_name, c.task_index) for _, c in sorted(results.items())] == [("ps", 0), ("worker", 0), ("worker", 1)]


def test_a_retried_aws_batch_job_does_not_read_the_last_attempts_addresses(tmp_path):
    stale = tmp_path / "4f1e-job-attempt1"
    stale.mkdir()
    for i in range(3):
        (stale / str(i)).write_text(f"10.9.9.{i}")
    meet = rendezvous.DirectoryRendezvous(tmp_path, "172.31.0.11", timeout_secs=0.3, poll_secs=0.05)
    with pytest.raises(ClusterError, match="have not published"):
        resolve(None, {**batch_env(1, "172.31.0.10"), "AWS_BATCH_JOB_ATTEMPT": "2"}, ResolveOptions(rendezvous=meet))


def test_aws_batch_rendezvous_times_out_naming_the_missing_nodes(tmp_path):
    clock = FakeClock()  # the default timeout, reached without waiting for it
    meet = rendezvous.DirectoryRendezvous(tmp_path, "172.31.0.11", clock=clock)
    with pytest.raises(ClusterError, match=r"after 600 s nodes \[0, 2\] of 3 have not published"):
        resolve(None, batch_env(1, "172.31.0.10"), ResolveOptions(rendezvous=meet))
    assert 600 < clock.now <= 600.5 and set(clock.sleeps) == {0.5}  # it looked every poll_secs until then


def test_aws_batch_without_a_rendezvous_dir_says_so():
    with pytest.raises(ClusterError, match="--rendezvous_dir"):
        resolve(None, batch_env(1, "172.31.0.10"))


def test_flags_that_say_another_cluster_than_tf_config_are_refused_naming_both():
    explicit = spec.ClusterConfig(("p:1",), ("w:1",), "worker", 0)
    with pytest.raises(ClusterError, match=r"the cluster flags say this is worker:0 .* but TF_CONFIG says ps:0"):
        resolve(explicit, tfjob_env("ps", 0))
    same = from_tf_config(tfjob_env("worker", 1)["TF_CONFIG"])
    assert resolve(same, tfjob_env("worker", 1)).source == "flags"


def test_a_role_alone_takes_the_environments_cluster_or_mnist_replicas():
    assert resolve(None, tfjob_env("worker", 1), role=("worker", 1)).source == "TF_CONFIG"
    with pytest.raises(ClusterError, match=r"--job_name=ps --task_index=1 say this is ps:1, but TF_CONFIG says "
                                           r"worker:1"):
        resolve(None, tfjob_env("worker", 1), role=("ps", 1))
    default = resolve(None, {}, role=("worker", 1))
    assert default.cluster == spec.ClusterConfig(("localhost:2222",), ("localhost:2223", "localhost:2224"), "worker", 1)
    assert "mnist_replica" in default.source


def test_job_name_task_index_ps_hosts_worker_hosts_in_the_environment():
    env = {"JOB_NAME": "worker", "TASK_INDEX": "1", "PS_HOSTS": "p:1", "WORKER_HOSTS": "w0:1,w1:1"}
    assert resolve(None, env).cluster == spec.ClusterConfig(("p:1",), ("w0:1", "w1:1"), "worker", 1)
    with pytest.raises(ClusterError, match="JOB_NAME, TASK_INDEX not set"):
        resolve(None, {"PS_HOSTS": "p:1", "WORKER_HOSTS": "w0:1"})  # never one process training alone
    # run_*.sh style: hosts in the environment, the task in the flags
    assert resolve(None, {"PS_HOSTS": "p:1", "WORKER_HOSTS": "w0:1"}, role=("ps", 0)).cluster.job_name == "ps"
    with pytest.raises(ClusterError, match="TASK_INDEX=5 is not a task of WORKER_HOSTS"):
        resolve(None, {**env, "TASK_INDEX": "5"})
    assert resolve(None, {"JOB_NAME": "nightly-build"}).cluster.job_name is None  # a CI's job name is no cluster


def test_tf_config_and_job_name_variables_that_disagree_are_refused_naming_both():
    env = {**tfjob_env("worker", 1), "JOB_NAME": "ps", "TASK_INDEX": "0", "PS_HOSTS": "p:1", "WORKER_HOSTS": "w:1"}
    with pytest.raises(ClusterError, match="JOB_NAME, TASK_INDEX, PS_HOSTS and WORKER_HOSTS say this is ps:0 .* but "
                                           "TF_CONFIG says worker:1"):
        resolve(None, env)


@pytest.mark.parametrize("env, message", [
    ({"SLURM_NTASKS": "four"}, "SLURM_NTASKS='four' is not a number"),
    ({"AWS_BATCH_JOB_NUM_NODES": "2x"}, "AWS_BATCH_JOB_NUM_NODES='2x' is not a number"),
    ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "first", "AWS_BATCH_JOB_ID": "j"},
     "AWS_BATCH_JOB_NODE_INDEX='first' is not a number"),
    ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1"}, "AWS_BATCH_JOB_ID is missing"),
])
def test_a_platform_count_that_is_no_number_is_named(env, message):
    with pytest.raises(ClusterError, match=message):
        resolve(None, env)


def test_an_aws_batch_array_job_is_refused_rather_than_training_alone_on_every_child():
    with pytest.raises(ClusterError, match="AWS_BATCH_JOB_ARRAY_INDEX=3.*multi-node parallel job"):
        resolve(None, {"AWS_BATCH_JOB_ARRAY_INDEX": "3", "AWS_BATCH_JOB_ID": "j:3"})


@pytest.mark.parametrize("tf_config, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 3}}',
     "task worker:3 is out of range"),
    ('{"cluster": {"ps": ["p:1"], "boss": ["b:1"]}, "task": {"type": "ps", "index": 0}}', "unknown job"),
    ('{"cluster": {"chief": ["c:1"], "master": ["m:1"], "ps": ["p:1"]}, "task": {"type": "ps"}}',
     "both 'chief' and 'master'"),
    ('{"cluster": {"worker": ["w:1", "w2:1"]}, "task": {"type": "worker", "index": 0}}', "no 'ps' job"),
])
def test_bad_tf_config_is_refused_with_a_clear_message(tf_config, message):
    with pytest.raises(ClusterError, match=message):
        resolve(None, {"TF_CONFIG": tf_config})


# A JobSet pod's environment as scripts/make_jobset.py's manifest gives it: the layout, and the downward
# API's copy of the pod's JobSet annotations; Kubernetes sets JOB_COMPLETION_INDEX in an Indexed Job.
def jobset_env(job, index, layout='{"ps":2,"chief":1,"worker":2,"evaluator":1,"port":2222}'):
    return {"PS_TRAINER_JOBSET": layout, "PS_TRAINER_JOBSET_NAME": "ctr", "PS_TRAINER_REPLICATED_JOB": job,
            "PS_TRAINER_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": str(index)}


@pytest.mark.parametrize("job, index, replica", [("ps", 1, None), ("chief", 0, 0), ("worker", 1, 2),
                                                 ("evaluator", 0, None)])
def test_a_jobset_pod_reads_every_host_and_its_own_task_from_its_environment(job, index, replica):
    resolved = resolve(None, jobset_env(job, index))
    cluster = resolved.cluster
    assert resolved.source == "JobSet ctr (PS_TRAINER_JOBSET)"
    assert cluster.ps_hosts == ("ctr-ps-0-0.ctr:2222", "ctr-ps-0-1.ctr:2222")
    assert cluster.chief_hosts == ("ctr-chief-0-0.ctr:2222",)
    assert cluster.worker_hosts == ("ctr-worker-0-0.ctr:2222", "ctr-worker-0-1.ctr:2222")
    assert (cluster.job_name, cluster.task_index) == (job, index)
    if replica is not None:
        assert cluster.replica_index == replica and cluster.is_chief == (replica == 0)


def test_a_jobset_subdomain_names_the_hosts_and_a_trainjob_is_the_same_jobset():
    layout = '{"ps":1,"chief":1,"worker":0,"port":2300,"subdomain":"net"}'
    cluster = resolve(None, jobset_env("chief", 0, layout)).cluster
    assert cluster.ps_hosts == ("ctr-ps-0-0.net:2300",) and cluster.worker_hosts == ()


@pytest.mark.parametrize("change, message", [
    ({"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX=2 is out of range: PS_TRAINER_JOBSET has 2 worker task"),
    ({"PS_TRAINER_REPLICATED_JOB": "workers"}, "PS_TRAINER_REPLICATED_JOB=workers: the replicated jobs are"),
    ({"PS_TRAINER_JOBSET_NAME": ""}, "PS_TRAINER_JOBSET_NAME is not set"),
    ({"PS_TRAINER_JOB_INDEX": "1"}, "PS_TRAINER_JOB_INDEX=1: each replicated job is one Job"),
    ({"PS_TRAINER_JOBSET": '{"ps":0,"chief":1,"port":2222}'}, "a job needs at least one ps"),
    ({"PS_TRAINER_JOBSET": '{"ps":1,"chief":1}'}, "the counts and the port must be integers"),
    ({"PS_TRAINER_JOBSET": '{"ps":1,"chief":1,"port":2222,"master":1}'}, "must be a JSON object of replica counts"),
    ({"PS_TRAINER_JOBSET": "{ps"}, "PS_TRAINER_JOBSET is not valid JSON"),
])
def test_a_jobset_pod_whose_environment_is_wrong_is_refused_naming_the_variable(change, message):
    with pytest.raises(ClusterError, match=message):
        resolve(None, {**jobset_env("worker", 1), **change})
