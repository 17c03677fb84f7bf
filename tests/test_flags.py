"""Flag validation: every bad command line is refused before any server starts, naming the flag."""

import dataclasses

import pytest
import tensorflow as tf
from absl import app
from absl import flags as absl_flags
from absl.flags import FLAGS

from ps_trainer.cluster import model_dir as layout
from ps_trainer.flags import config as flag_config
from tests.support import read_flags, write_click_csvs
from ps_trainer.training import exit_codes, plan, run_record, start

pytestmark = pytest.mark.pure

CLUSTER = ["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224"]
WORKER = [*CLUSTER, "--job_name=worker", "--task_index=0", "--model_dir=/tmp/unused"]


def usage_error(*args) -> str:
    with pytest.raises(app.UsageError) as err:
        read_flags(*args)
    return str(err.value)


def test_a_full_worker_command_line_reads_into_plain_values():
    cfg = read_flags(*WORKER, "--task_index=1", "--sync_replicas", "--optimizer=adam")
    assert cfg.cluster.ps_hosts == ("127.0.0.1:2222",)
    assert cfg.cluster.worker_hosts == ("127.0.0.1:2223", "127.0.0.1:2224")
    assert (cfg.cluster.job_name, cfg.cluster.task_index, cfg.cluster.is_chief) == ("worker", 1, False)
    assert cfg.train.sync_replicas and cfg.train.replicas_to_aggregate == 2
    assert cfg.train.optimizer == "adam"
    assert cfg.train.save_checkpoint_secs == 600 and cfg.train.save_checkpoint_steps is None
    assert cfg.train.save_graph_def and not read_flags(*WORKER, "--nosave_graph_def").train.save_graph_def


def test_no_cluster_means_one_process_training():
    cfg = read_flags("--model_dir=/tmp/unused")
    assert not cfg.cluster.is_distributed and cfg.cluster.is_chief


def test_ps_needs_no_model_dir_and_no_data():
    cfg = read_flags(*CLUSTER, "--job_name=ps", "--task_index=0", "--dataset=tfrecord")
    assert cfg.cluster.job_name == "ps"


@pytest.mark.parametrize("hosts, expected", [
    ("--ps_hosts=localhost", "--ps_hosts: 'localhost' is not host:port"),
    ("--ps_hosts=:2222", "--ps_hosts: ':2222' is not host:port"),
    ("--ps_hosts=h:port", "non-numeric port 'port'"),
    ("--ps_hosts=h:70000", "port 70000, outside 1..65535"),
    ("--ps_hosts=h:0", "port 0, outside 1..65535"),
])
def test_malformed_or_out_of_range_hosts_are_refused(hosts, expected):
    message = usage_error(hosts, "--worker_hosts=h:2223", "--job_name=ps", "--task_index=0")
    assert expected in message


def test_ipv6_hosts_are_accepted():
    cfg = read_flags("--ps_hosts=[::1]:2222", "--worker_hosts=[::1]:2223", "--job_name=ps", "--task_index=0")
    assert cfg.cluster.ps_hosts == ("[::1]:2222",)


def test_the_same_host_port_twice_is_refused():
    message = usage_error("--ps_hosts=h:2222", "--worker_hosts=h:2223,h:2222", "--job_name=ps", "--task_index=0")
    assert "h:2222 appears twice (in --ps_hosts and --worker_hosts)" in message


@pytest.mark.parametrize("job, index, expected", [
    ("worker", 2, "--task_index=2 is out of range: --worker_hosts lists 2 worker task(s) (0..1)"),
    ("ps", 1, "--task_index=1 is out of range: --ps_hosts lists 1 ps task(s) (0..0)"),
])
def test_task_index_out_of_range_for_its_job(job, index, expected):
    assert expected in usage_error(*CLUSTER, f"--job_name={job}", f"--task_index={index}",
                                   "--model_dir=/tmp/unused")


def test_negative_task_index_is_refused_by_its_flag():
    with pytest.raises(absl_flags.IllegalFlagValueError, match="task_index"):
        read_flags(*WORKER, "--task_index=-1")


def test_replicas_to_aggregate_larger_than_workers():
    message = usage_error(*WORKER, "--sync_replicas", "--replicas_to_aggregate=3")
    assert "--replicas_to_aggregate=3 is larger than the 2 worker(s)" in message


def test_replicas_to_aggregate_without_sync():
    assert "only with --sync_replicas" in usage_error(*WORKER, "--replicas_to_aggregate=1")


def test_steps_per_run_is_refused_in_sync_mode():
    message = usage_error(*WORKER, "--sync_replicas", "--steps_per_run=10")
    assert "--steps_per_run=10 is for asynchronous training" in message


@pytest.mark.parametrize("args, expected", [
    (["--num_epochs=2"], "--num_epochs needs the input queue, and this run cannot use it: --dataset=synthetic has "
                         "no files"),
    (["--num_epochs=2", "--noinput_queue"], "--num_epochs needs the input queue (epochs are counted by it"),
    (["--input_queue", "--sync_replicas", "--replicas_to_aggregate=1"],
     "--replicas_to_aggregate=1 of 2 workers would drop the late workers' gradients"),
    (["--input_queue", "--steps_per_run=4"], "drop --steps_per_run=4"),
    (["--input_queue", "--cache=memory"], "drop --cache=memory"),
    (["--input_queue"], "--dataset=synthetic has none to hand out"),
])
def test_input_queue_combinations_it_does_not_take_are_refused(args, expected):
    assert expected in usage_error(*WORKER, *args)


def test_the_input_queue_is_on_by_default_for_files_in_a_cluster_where_it_works(tmp_path):
    write_click_csvs(tmp_path / "csv")
    files = ["--dataset=csv", f"--data_dir={tmp_path / 'csv'}", "--label_column=clicked", "--numeric_columns=price",
             "--model=wide_deep"]
    data = read_flags(*WORKER, *files).data
    assert data.input_queue and data.input_queue_by_default
    assert not read_flags(*WORKER, *files, "--noinput_queue").data.input_queue
    explicit = read_flags(*WORKER, *files, "--input_queue").data
    assert explicit.input_queue and not explicit.input_queue_by_default
    for args in (["--steps_per_run=4"], ["--cache=memory"], ["--sync_replicas", "--replicas_to_aggregate=1"],
                 # --local_steps outside rounds of rows: the tables' rows stay on the ps (Adam's slots decay)
                 ["--local_steps=10", "--optimizer=adam"]):
        assert not read_flags(*WORKER, *files, *args).data.input_queue, args
    # A round of rows reads its batches at once, as a step reads its batch: the queue counts them, when asked.
    for embedding in ("hashed", "dynamic"):
        for asked in ("--num_epochs=2", "--input_queue"):
            rounds = read_flags(*WORKER, *files, "--local_steps=10", f"--embedding={embedding}", asked)
            assert rounds.data.input_queue and rounds.train.step_path == plan.StepPath(plan.ROUNDS, 10, 10), (
                embedding, asked)
        assert not read_flags(*WORKER, *files, "--local_steps=10", f"--embedding={embedding}").data.input_queue
    assert "drop --local_steps=10" in usage_error(*WORKER, *files, "--local_steps=10", "--optimizer=adam",
                                                  "--input_queue")
    assert not read_flags("--model_dir=/tmp/unused", *files).data.input_queue  # one process
    assert not read_flags(*WORKER).data.input_queue  # generated data
    assert "this run cannot use it: --cache=memory keeps a fixed shard" in usage_error(
        *WORKER, *files, "--cache=memory", "--num_epochs=2")


def test_num_epochs_alone_lifts_the_step_limit_and_train_steps_still_caps_it():
    assert read_flags(*CLUSTER, "--job_name=ps", "--task_index=0", "--input_queue",
                      "--num_epochs=3").train.train_steps == flag_config.NO_STEP_LIMIT
    assert read_flags(*CLUSTER, "--job_name=ps", "--task_index=0", "--input_queue", "--num_epochs=3",
                      "--train_steps=500").train.train_steps == 500


@pytest.mark.parametrize("flag", ["--model=resnet", "--dataset=imagenet", "--optimizer=lbfgs"])
def test_unknown_model_dataset_or_optimizer(flag):
    name = flag.split("=")[0].lstrip("-")
    with pytest.raises(absl_flags.IllegalFlagValueError, match=f"flag --{name}=.*should be one of"):
        read_flags(*WORKER, flag)


def test_stray_positional_argument_the_bool_false_trap():
    message = usage_error(*WORKER, "--sync_replicas", "false")
    assert "unexpected argument(s) false" in message
    assert "--sync_replicas=false" in message


def test_job_name_without_hosts_and_hosts_without_job_name():
    assert "--worker_hosts is empty" in usage_error("--ps_hosts=h:1", "--job_name=worker", "--task_index=0",
                                                    "--model_dir=/x")
    assert "--job_name is not set" in usage_error(*CLUSTER)


def test_model_dir_defaults_only_where_every_task_can_share_it(tmp_path):
    chief = read_flags(*CLUSTER, "--job_name=worker", "--task_index=0").train.model_dir
    other = read_flags(*CLUSTER, "--job_name=worker", "--task_index=1").train.model_dir
    assert chief == other and "ps-trainer-" in chief
    assert read_flags(*CLUSTER, "--job_name=ps", "--task_index=0").train.model_dir == chief  # done marks are there
    assert read_flags("--ps_hosts=10.0.0.1:2222", "--worker_hosts=10.0.0.2:2222", "--job_name=ps",
                      "--task_index=0").train.model_dir is None
    assert read_flags().train.model_dir != read_flags(f"--model_dir={tmp_path}").train.model_dir
    message = usage_error("--ps_hosts=10.0.0.1:2222", "--worker_hosts=10.0.0.2:2222", "--job_name=worker",
                          "--task_index=0")
    assert "--model_dir is required for a cluster across hosts (10.0.0.1, 10.0.0.2)" in message
    (tmp_path / "file").write_text("")
    assert "is a file" in usage_error("--model_dir=" + str(tmp_path / "file" / "run"))


def test_reading_the_flags_opens_no_file_of_the_run_and_the_start_checks_them_on_disk(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    args = ["--model=wide_deep", "--dataset=clicks", "--embedding=dynamic", f"--model_dir={tmp_path / 'file' / 'run'}",
            f"--cache={tmp_path / 'file'}"]
    opened = []
    monkeypatch.setattr(tf.io.gfile, "GFile", lambda *a, **k: opened.append(a) or open("/dev/null"))
    monkeypatch.setattr(tf.io.gfile, "exists", lambda path: opened.append(path))
    FLAGS.unparse_flags()
    cfg = flag_config.read(FLAGS, FLAGS(["trainer.py", *args]))
    assert not opened and cfg.train.model_dir == str(tmp_path / "file" / "run")
    monkeypatch.undo()
    with pytest.raises(app.UsageError,
                       match=r"--model_dir=.*/file/run cannot be created or written: .*/file is a file"):
        start.settle(cfg)


def test_both_checkpoint_intervals_is_refused():
    message = usage_error(*WORKER, "--save_checkpoint_steps=10", "--save_checkpoint_secs=60")
    assert "--save_checkpoint_steps and --save_checkpoint_secs are both set" in message


def test_incremental_checkpoints_need_tables_and_come_between_full_ones():
    cfg = read_flags(*WORKER, "--model=wide_deep", "--dataset=clicks", "--incremental_save_secs=60")
    assert cfg.train.incremental_save_secs == 60 and cfg.model.mark_touched_rows
    assert not read_flags(*WORKER, "--model=wide_deep", "--dataset=clicks").model.mark_touched_rows
    assert "--model=mlp has no tables" in usage_error(*WORKER, "--incremental_save_secs=60")
    assert "--save_checkpoint_secs=600: make it smaller" in usage_error(
        *WORKER, "--model=wide_deep", "--dataset=clicks", "--incremental_save_secs=600")
    assert read_flags(*WORKER, "--model=wide_deep", "--dataset=clicks", "--incremental_save_secs=600",
                      "--save_checkpoint_steps=5000").train.incremental_save_secs == 600


def test_tables_stay_whole_when_they_spread_evenly_over_the_ps_tasks(tmp_path):
    two_ps = ("--ps_hosts=localhost:2222,localhost:2223", "--worker_hosts=localhost:2224", "--job_name=worker",
              "--task_index=0", "--model=wide_deep", f"--model_dir={tmp_path}")
    for embedding in ("--embedding=hashed", "--embedding=dynamic"):
        assert read_flags(*two_ps, embedding, "--dataset=zipf_clicks").model.embedding_partitions == 1  # 13 a ps
        assert read_flags(*two_ps, embedding, "--dataset=clicks").model.embedding_partitions == 2  # 3: 2 and 1, cut
    assert read_flags(*two_ps, "--dataset=zipf_clicks", "--embedding_partitions=3").model.embedding_partitions == 3
    assert read_flags("--model=wide_deep", "--dataset=clicks").model.embedding_partitions == 1


def a_checkpoint(directory):
    """A real checkpoint in directory (eager: no session), which tf.train.latest_checkpoint finds."""
    tf.train.Checkpoint(global_step=tf.Variable(0, dtype=tf.int64)).save(str(directory / "model.ckpt"))


def test_a_dynamic_run_resumes_with_its_checkpoints_shards_unless_the_flag_says(tmp_path):
    """A dynamic table's IDs restore only into as many shards as were saved: a run resumed without
    --embedding_partitions keeps them, whatever the default is now (it was one per ps before tables
    stayed whole)."""
    two_ps = ("--ps_hosts=localhost:2222,localhost:2223", "--worker_hosts=localhost:2224", "--job_name=worker",
              "--task_index=0", "--model=wide_deep", "--dataset=zipf_clicks", f"--model_dir={tmp_path}",
              "--embedding=dynamic")
    fresh = read_flags(*two_ps)
    assert fresh.model.embedding_partitions == 1
    run_record.write(dataclasses.replace(fresh, model=dataclasses.replace(fresh.model, embedding_partitions=2)))
    assert read_flags(*two_ps).model.embedding_partitions == 1  # a record, but no checkpoint to resume
    a_checkpoint(tmp_path)
    assert read_flags(*two_ps).model.embedding_partitions == 2
    assert read_flags(*two_ps, "--embedding_partitions=1").model.embedding_partitions == 1  # the worker refuses it
    assert read_flags(*two_ps[:-1]).model.embedding_partitions == 1  # hashed tables recut as they restore


@pytest.mark.parametrize("text, problem", [
    (b'{"model": {"embedding": "dyn', "Unterminated string"),  # cut short
    (b"\xff\xfe{", "codec can't decode"),  # not text
    (b"[1, 2]", "no model settings"),  # JSON, but not a record
], ids=["cut short", "not text", "not a record"])
def test_a_run_record_that_is_not_one_stops_the_task_naming_it_until_moved_aside(tmp_path, text, problem):
    """A resume reads run.json (the dynamic tables' shards): a file there that is no record ends the task
    with one line naming it, on a permanent code, rather than a traceback or a guess."""
    args = ("--ps_hosts=localhost:2222", "--worker_hosts=localhost:2224", "--job_name=worker", "--task_index=0",
            "--model=wide_deep", "--dataset=zipf_clicks", f"--model_dir={tmp_path}", "--embedding=dynamic")
    a_checkpoint(tmp_path)
    (tmp_path / layout.RUN_RECORD).write_bytes(text)
    with pytest.raises(exit_codes.Failure) as failure:
        read_flags(*args)
    assert failure.value.outcome is exit_codes.RUN_RECORD_UNREADABLE and failure.value.outcome.code == 1
    message = str(failure.value)
    assert message.startswith(f"{tmp_path / layout.RUN_RECORD} is not the run record") and problem in message
    assert "\n" not in message
    (tmp_path / layout.RUN_RECORD).rename(tmp_path / "run.json.bad")
    assert read_flags(*args).model.embedding_partitions == 1  # no record: this run's own cut


def test_checkpoint_steps_replace_the_default_seconds():
    cfg = read_flags(*WORKER, "--save_checkpoint_steps=10")
    assert (cfg.train.save_checkpoint_steps, cfg.train.save_checkpoint_secs) == (10, None)


@pytest.mark.parametrize("args, refusal", [
    (["--model=mlp", "--embedding=dynamic"], "--embedding sets embedding tables: --model=mlp has none"),
    (["--model=cnn", "--embedding_dim=8"], "--embedding_dim sets embedding tables: --model=cnn has none"),
    (["--model=wide_deep", "--embedding_min_count=3"], "--embedding_min_count is for --embedding=dynamic"),
    (["--model=wide_deep", "--embedding=hashed", "--embedding_steps_to_live=100"],
     "--embedding_steps_to_live is for --embedding=dynamic"),
    (["--model=wide_deep", "--embedding_growth"], "--embedding_growth is for --embedding=dynamic"),
    (["--model=wide_deep", "--embedding=dynamic", "--hash_buckets=1000"], "--hash_buckets sizes hashed tables"),
], ids=["dynamic tables for the mlp", "a width for the cnn", "admission for hashed tables",
        "eviction for hashed tables", "growth for hashed tables", "buckets for dynamic tables"])
def test_a_table_flag_that_would_do_nothing_is_refused_by_name(args, refusal):
    """Admission, eviction or a table size that the run would ignore: the user would believe them on."""
    assert usage_error(*WORKER, "--dataset=clicks", *args).startswith(refusal)


def test_the_table_flags_of_the_tables_in_use_are_taken():
    dynamic = read_flags(*WORKER, "--dataset=clicks", "--model=wide_deep", "--embedding=dynamic",
                         "--embedding_min_count=3", "--embedding_steps_to_live=100", "--embedding_growth",
                         "--embedding_dim=4", "--embedding_partitions=2")
    assert (dynamic.model.embedding_min_count, dynamic.model.embedding_steps_to_live) == (3, 100)
    assert dynamic.model.embedding_growth and dynamic.model.embedding_dim == 4
    assert read_flags(*WORKER, "--dataset=clicks", "--model=wide_deep", "--hash_buckets=77").model.hash_buckets == 77


def test_tfrecord_dataset_needs_files(tmp_path):
    assert "--dataset=tfrecord needs --data_dir" in usage_error(*WORKER, "--dataset=tfrecord")
    message = usage_error(*WORKER, "--dataset=tfrecord", f"--data_dir={tmp_path}")
    assert f"--data_dir={tmp_path} holds no train files" in message


def test_bad_hidden_units():
    assert "--hidden_units=0" in usage_error(*WORKER, "--hidden_units=0")
    assert "--hidden_units=a,b" in usage_error(*WORKER, "--hidden_units=a,b")


def test_flagfile_holds_a_whole_command_line(tmp_path):
    flagfile = tmp_path / "worker1.flags"
    flagfile.write_text("\n".join([*WORKER, "--task_index=1", "--train_steps=77"]) + "\n")
    cfg = read_flags(f"--flagfile={flagfile}")
    assert (cfg.cluster.task_index, cfg.train.train_steps) == (1, 77)


def test_a_separate_chief_task_and_the_master_alias():
    hosts = ["--ps_hosts=p:1", "--chief_hosts=c:1", "--worker_hosts=w0:1,w1:1", "--model_dir=/tmp/unused"]
    chief = read_flags(*hosts, "--job_name=master", "--task_index=0").cluster
    assert (chief.job_name, chief.is_chief, chief.num_replicas, chief.worker_device()) == (
        "chief", True, 3, "/job:chief/task:0")
    worker = read_flags(*hosts, "--job_name=worker", "--task_index=0").cluster
    assert not worker.is_chief and worker.replica_index == 1
    assert "--chief_hosts lists 2 hosts" in usage_error("--ps_hosts=p:1", "--chief_hosts=c:1,d:1",
                                                        "--job_name=chief", "--task_index=0", "--model_dir=/x")


def test_evaluator_needs_only_a_model_dir():
    cfg = read_flags("--job_name=evaluator", "--model_dir=/tmp/unused")
    assert cfg.cluster.job_name == "evaluator" and not cfg.cluster.is_distributed
    assert "--model_dir is required" in usage_error("--job_name=evaluator")


def test_tf_config_names_the_cluster_and_flags_that_disagree_are_refused():
    env = {"TF_CONFIG": '{"cluster": {"ps": ["x:1"], "worker": ["y:1"]}, "task": {"type": "ps", "index": 0}}'}
    FLAGS.unparse_flags()
    argv = FLAGS(["trainer.py", *WORKER])
    with pytest.raises(app.UsageError, match="but TF_CONFIG says ps:0"):
        flag_config.read(FLAGS, argv, env)
    FLAGS.unparse_flags()
    argv = FLAGS(["trainer.py", "--model_dir=/tmp/unused"])
    cfg = flag_config.read(FLAGS, argv, env)
    assert cfg.cluster_source == "TF_CONFIG" and cfg.cluster.job_name == "ps"


def test_mnist_replicas_own_flags_are_understood(tmp_path):
    cfg = read_flags("--job_name=worker", "--task_index=1", "--num_gpus=0", "--existing_servers=False",
                     "--hidden_units=100", "--sync_replicas=True", "--replicas_to_aggregate=2",
                     f"--model_dir={tmp_path}")
    assert cfg.cluster.num_gpus == 0 and cfg.cluster.compute_device() == "/job:worker/task:1/device:CPU:0"
    assert cfg.train.sync_replicas and cfg.model.hidden_units == (100,)
    assert "--existing_servers=true" in usage_error("--job_name=ps", "--task_index=0", "--existing_servers")


def test_mnist_replicas_usage_lines_run_as_written():
    ps = read_flags("--job_name=ps", "--task_index=0").cluster
    assert (ps.ps_hosts, ps.worker_hosts, ps.task_name) == (
        ("localhost:2222",), ("localhost:2223", "localhost:2224"), "ps:0")
    worker = read_flags("--job_name=worker", "--task_index=1", "--model_dir=/tmp/unused")
    assert worker.cluster.task_name == "worker:1" and "mnist_replica" in worker.cluster_source
    assert "--task_index is required with --job_name=worker" in usage_error("--job_name=worker",
                                                                             "--model_dir=/tmp/unused")
    assert "--task_index needs --job_name" in usage_error("--task_index=1", "--model_dir=/tmp/unused")


def test_a_bad_environment_is_a_usage_error_naming_the_variable():
    FLAGS.unparse_flags()
    argv = FLAGS(["trainer.py", "--model_dir=/tmp/unused"])
    with pytest.raises(app.UsageError, match="TF_CONFIG is not valid JSON"):
        flag_config.read(FLAGS, argv, {"TF_CONFIG": "{oops"})


def test_sagemaker_hyperparameters_join_boolean_values():
    argv = ["trainer.py", "--sync_replicas", "True", "--train_steps", "500", "--model_dir", "s3://b/m"]
    joined = flag_config.join_separate_bool_values(argv, FLAGS)
    assert joined == ["trainer.py", "--sync_replicas=True", "--train_steps", "500", "--model_dir", "s3://b/m"]
    FLAGS.unparse_flags()
    env = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_MODEL_DIR": "/opt/ml/model",
           "SM_CHANNEL_TRAINING": "/opt/ml/input/data/training"}
    with pytest.raises(app.UsageError, match="SM_CHANNEL_TRAINING=/opt/ml/input/data/training holds no"):
        flag_config.read(FLAGS, FLAGS(joined), env)
    env.pop("SM_CHANNEL_TRAINING")
    cfg = flag_config.read(FLAGS, FLAGS(joined), env)
    assert cfg.train.sync_replicas and cfg.train.train_steps == 500
    # TensorFlow 2.21 cannot write s3://: on SageMaker the checkpoints go where SageMaker syncs them.
    assert cfg.train.model_dir == "/opt/ml/checkpoints" and cfg.train.export_copy_dir == "/opt/ml/model"
    assert "cannot open s3:// paths" in usage_error("--model_dir=s3://b/m")


@pytest.mark.parametrize("hosts", ["--ps_hosts=8.8.8.8:2222", "--ps_hosts=[2001:4860::8888]:2222"])
def test_a_public_address_is_refused_unless_the_user_says_there_is_a_firewall(hosts):
    from ps_trainer.training import roles
    cluster = read_flags(hosts, "--worker_hosts=10.0.0.2:2222", "--job_name=ps", "--task_index=0").cluster
    with pytest.raises(app.UsageError) as refused:
        roles.refuse_unsafe_serving(cluster, allow_public_addresses=False, skip_own_address_check=True)
    message = str(refused.value)
    assert "publicly routable" in message and "no authentication" in message
    assert "--allow_public_addresses" in message
    roles.refuse_unsafe_serving(cluster, allow_public_addresses=True, skip_own_address_check=True)


def test_private_loopback_and_cgnat_addresses_are_accepted():
    from ps_trainer.training import roles
    cfg = read_flags("--ps_hosts=10.0.0.1:1,192.168.1.2:1,172.16.0.3:1", "--worker_hosts=127.0.0.1:1,100.64.0.9:1",
                     "--job_name=ps", "--task_index=0")
    roles.refuse_unsafe_serving(cfg.cluster, allow_public_addresses=False, skip_own_address_check=True)
    assert cfg.cluster.num_ps == 3


def test_names_are_checked_by_what_they_resolve_to():
    from ps_trainer.cluster import guard, spec
    cluster = spec.ClusterConfig(("ps-0.team.svc:2222",), ("gateway.example:2222", "later.team.svc:2222"), "ps", 0)
    table = {"ps-0.team.svc": ["10.1.2.3"], "gateway.example": ["203.0.113.7", "93.184.216.34"]}

    def lookup(host):
        if host not in table:
            raise OSError("not known yet")
        return table[host]

    assert guard.public_addresses(cluster, lookup) == ["gateway.example:2222"]


def write_formats(directory, *formats):
    import numpy as np

    from ps_trainer.input import idx
    directory.mkdir(parents=True, exist_ok=True)
    if "idx" in formats:
        idx.write(np.zeros((3, 28, 28), np.uint8), np.zeros(3, np.uint8), str(directory), "train")
    if "tfrecord" in formats:
        (directory / "train-00000-of-00001.tfrecord").write_bytes(b"")
    if "csv" in formats:
        (directory / "train-0.csv").write_text("label,x\n1,2.0\n")
    return str(directory)


def test_a_data_dir_with_the_default_dataset_is_read_in_the_format_it_holds(tmp_path):
    for fmt in ("idx", "tfrecord"):
        data_dir = write_formats(tmp_path / fmt, fmt)
        assert read_flags("--model_dir=/tmp/unused", f"--data_dir={data_dir}").data.name == fmt
    both = write_formats(tmp_path / "both", "idx", "tfrecord")
    assert usage_error("--model_dir=/tmp/unused", f"--data_dir={both}") == (
        f"--data_dir={both} holds tfrecord and idx files: name the format to read with "
        "--dataset=tfrecord, csv or idx.")
    assert "holds no train-*.tfrecord, train-*.csv or MNIST IDX" in usage_error(
        "--model_dir=/tmp/unused", f"--data_dir={tmp_path / 'empty'}")


def test_a_data_dir_is_never_silently_ignored_by_generated_data(tmp_path):
    data_dir = write_formats(tmp_path / "idx", "idx")
    assert usage_error("--model_dir=/tmp/unused", "--dataset=synthetic", f"--data_dir={data_dir}") == (
        f"--data_dir={data_dir} is not read by --dataset=synthetic (generated data): drop it, or name its "
        "format with --dataset=tfrecord, csv or idx.")


@pytest.mark.parametrize("scheme", ["s3", "hdfs"])
def test_storage_tensorflow_cannot_open_is_refused_at_startup(scheme):
    for args in ([f"--data_dir={scheme}://b/d", "--dataset=tfrecord"], [f"--model_dir={scheme}://b/m"]):
        message = usage_error(*(["--model_dir=/tmp/unused"] if "--dataset=tfrecord" in args else []), *args)
        assert f"cannot open {scheme}:// paths" in message and "mount" in message
        assert "\n" not in message


def test_cache_takes_none_memory_or_a_directory(tmp_path):
    data_dir = write_formats(tmp_path / "idx", "idx")
    assert read_flags("--model_dir=/tmp/unused", f"--data_dir={data_dir}").data.cache is None
    assert read_flags("--model_dir=/tmp/unused", "--cache=none").data.cache == "none"
    (tmp_path / "file").write_text("x")
    assert usage_error("--model_dir=/tmp/unused", f"--cache={tmp_path / 'file'}") == (
        f"--cache={tmp_path / 'file'} is a file: give 'none', 'memory' or a directory.")


def test_the_evaluator_follows_the_runs_record_not_its_own_flags(tmp_path):
    from ps_trainer.training import run_record
    chief = read_flags("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=worker",
                       "--task_index=0", f"--model_dir={tmp_path}", "--model=wide_deep", "--dataset=clicks",
                       "--train_steps=5000", "--hidden_units=64,32", "--embedding_dim=8", "--seed=7")
    assert run_record.read(str(tmp_path)) is None
    run_record.write(chief)
    evaluator = read_flags("--job_name=evaluator", f"--model_dir={tmp_path}", "--eval_data_dir=/elsewhere")
    followed, changed = run_record.follow(evaluator, run_record.read(str(tmp_path)))
    assert followed.train.train_steps == 5000 and followed.model == chief.model
    assert followed.data.name == "clicks" and followed.data.seed == 7
    assert followed.data.eval_data_dir == "/elsewhere"  # paths stay the evaluator's own
    assert changed[:3] == ["--train_steps=5000", "--model=wide_deep", "--hidden_units=64,32"]
    assert not [name for name in tmp_path.iterdir() if name.name != layout.RUN_RECORD]  # no temporary file left


def test_a_worker_whose_model_or_data_flags_are_not_the_chiefs_is_refused_naming_both(tmp_path):
    from ps_trainer.training import run_record
    common = ["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224", "--job_name=worker",
              f"--model_dir={tmp_path}", "--model=wide_deep", "--dataset=clicks", "--hash_buckets=5000"]
    run_record.write(read_flags(*common, "--task_index=0", "--train_steps=5000"))
    record = run_record.read(str(tmp_path))

    def refusal(*args):
        return run_record.peer_refusal(record, read_flags(*common, "--task_index=1", *args))

    # Not compared: --train_steps (the chief's ends the run), reading choices, and the optimizer's settings.
    assert refusal("--train_steps=9000", "--shuffle_buffer=100", "--learning_rate=0.5") is None
    assert refusal("--hash_buckets=1000", "--embedding_dim=8") == (
        "--hash_buckets=1000 --embedding_dim=8: the chief trains with --hash_buckets=5000 --embedding_dim=16 (run.json "
        "in --model_dir): every worker needs the chief's model and data flags; start this one with them")
    assert refusal("--dataset=zipf_clicks").startswith("--dataset=zipf_clicks: the chief trains with --dataset=clicks")
    assert refusal("--hidden_units=64,32").startswith("--hidden_units=64,32: the chief trains with --hidden_units=256")
    assert run_record.peer_refusal(None, read_flags(*common, "--task_index=1", "--hash_buckets=7")) is None


@pytest.mark.parametrize("args,expected", [
    (["--sync_replicas", "--local_steps=10"], "--local_steps=10 is for asynchronous training"),
    (["--local_steps=10", "--steps_per_run=5"], "--steps_per_run=5 with --local_steps=10"),
    (["--local_steps=10", "--wire_dtype=bfloat16"], "--wire_dtype=bfloat16 with --local_steps"),
    (["--local_steps=10", "--steps_per_run=5", "--model=wide_deep", "--dataset=clicks"],
     "--steps_per_run=5 with --local_steps=10: a session.run is one round of --local_steps steps"),
    (["--local_steps=10", "--steps_per_run=5", "--model=wide_deep", "--dataset=clicks", "--optimizer=adam"],
     "--steps_per_run=5 with --local_steps=10 and --model=wide_deep: its tables' rows are read a step at a time"),
    (["--sync_replicas", "--accumulate_batches=4", "--model=wide_deep", "--dataset=clicks"],
     "--accumulate_batches with --model=wide_deep"),
    (["--accumulate_batches=4"], "--accumulate_batches=4 is for --sync_replicas"),
    (["--sync_replicas", "--accumulate_batches=4", "--wire_dtype=float16"], "--wire_dtype=float16 with --accumulate"),
])
def test_fewer_round_trips_are_refused_where_they_do_not_apply(args, expected):
    assert expected in usage_error(*WORKER, *args)


def test_one_process_refuses_steps_per_run_beside_local_steps_with_tables_it_reads_a_step_at_a_time():
    # A cluster trains hashed tables in rounds of --local_steps (a run per round); one process reads its
    # tables as they are, a step a run, and would ignore the flag.
    assert "in one process: its tables' rows are read a step at a time" in usage_error(
        "--local_steps=10", "--steps_per_run=10", "--model=wide_deep", "--dataset=clicks")
    assert read_flags(*WORKER, "--local_steps=10", "--steps_per_run=10", "--model=wide_deep",
                      "--dataset=clicks").train.step_path.steps_per_run == 10


def test_nothread_spinning_reaches_the_cluster_config_and_a_local_cluster_sets_it_when_cores_are_short(
        tmp_path, monkeypatch):
    assert read_flags(*WORKER).cluster.thread_spinning
    assert not read_flags(*WORKER, "--nothread_spinning").cluster.thread_spinning
    from ps_trainer.launch import processes
    monkeypatch.setattr(processes, "free_ports", lambda count: list(range(20000, 20000 + count)))  # no socket
    for cores, expected in ((2, False), (8, True)):  # 1 ps + 2 workers: three tasks
        monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)))
        cluster = processes.LocalCluster(tmp_path / str(cores), 1, 2, ["--train_steps=5"])
        hosts = [f"--ps_hosts={','.join(cluster.ps_hosts)}", f"--worker_hosts={','.join(cluster.worker_hosts)}",
                 "--job_name=worker", "--task_index=0", "--model_dir=/tmp/unused"]
        assert read_flags(*cluster.trainer_args, *hosts).cluster.thread_spinning is expected, cluster.trainer_args


def test_local_steps_run_a_round_per_session_run_with_one_workers_momentum():
    cfg = read_flags(*WORKER, "--local_steps=10")
    # Two async workers get momentum 0.8; a round of local steps reads no stale values.
    assert cfg.train.step_path == plan.StepPath(plan.LOCAL_STEPS, 10) and cfg.train.momentum == 0.9
    assert read_flags(*WORKER).train.momentum == 0.8
    # Hashed or dynamic tables, trained by an optimizer whose slots add: a run is a round, of 10 batches read
    # at once.
    hashed = ("--local_steps=10", "--model=wide_deep", "--dataset=clicks")
    for optimizer in ([], ["--optimizer=adagrad"], ["--optimizer=sgd"], ["--embedding=dynamic"]):
        tables = read_flags(*WORKER, *hashed, *optimizer).train
        assert tables.local_steps == 10 and tables.step_path == plan.StepPath(plan.ROUNDS, 10, 10), optimizer
    # Slots that decay: a run is one step, the rows read on the ps as each batch names them.
    for other in (["--optimizer=adam"], ["--optimizer=momentum"], ["--embedding=dynamic", "--optimizer=adam"]):
        tables = read_flags(*WORKER, *hashed, *other).train
        assert tables.local_steps == 10 and tables.step_path == plan.StepPath(plan.LOCAL_STEPS), other


def _click_files(tmp_path) -> list[str]:
    write_click_csvs(tmp_path / "csv")
    return ["--dataset=csv", f"--data_dir={tmp_path / 'csv'}", "--label_column=clicked", "--numeric_columns=price",
            "--model=wide_deep"]


def test_a_worker_joining_a_running_job_reads_into_a_replica_past_the_list(tmp_path):
    cfg = read_flags(*WORKER, *_click_files(tmp_path), "--task_index=2", "--join_address=127.0.0.1:2230")
    cluster = cfg.cluster
    assert cluster.joins and (cluster.replica_index, cluster.num_replicas, cluster.is_chief) == (2, 2, False)
    assert cluster.own_address() == "127.0.0.1:2230" and cfg.data.input_queue


@pytest.mark.parametrize("args, expected", [
    (["--task_index=2"], "--task_index=2 is out of range: --worker_hosts lists 2 worker task(s) (0..1) (a worker "
                         "joining a running job gives its own address with --join_address)"),
    (["--task_index=1", "--join_address=127.0.0.1:2230"], "--join_address with --task_index=1: --worker_hosts lists "
                                                          "that worker already (0..1)"),
    (["--task_index=2", "--join_address=127.0.0.1:2224"], "--join_address=127.0.0.1:2224 is in --worker_hosts already"),
    (["--task_index=2", "--join_address=127.0.0.1"], "--join_address: '127.0.0.1' is not host:port"),
    (["--task_index=1024", "--join_address=127.0.0.1:2230"], "a job holds at most 1024 training replicas"),
    (["--task_index=2", "--join_address=127.0.0.1:2230", "--sync_replicas"], "only asynchronous jobs take joining"),
    (["--task_index=2", "--join_address=127.0.0.1:2230", "--noinput_queue"],
     "a joining worker takes its files from the input queue (fixed shards are cut for the workers the job started "
     "with); drop --noinput_queue"),
    (["--task_index=2", "--join_address=127.0.0.1:2230", "--steps_per_run=4"],
     "and this run cannot use it: --steps_per_run=4 trains several batches a step"),
])
def test_a_joining_worker_is_refused_what_cannot_join(tmp_path, args, expected):
    assert expected in usage_error(*WORKER, *_click_files(tmp_path), *args)


def test_only_a_worker_joins():
    assert "--join_address is for a worker joining a running job, not --job_name=ps" in usage_error(
        *CLUSTER, "--job_name=ps", "--task_index=0", "--join_address=127.0.0.1:2230")


def test_a_group_column_is_a_feature_of_the_dataset():
    read = read_flags(*WORKER, "--dataset=clicks", "--model=wide_deep", "--group_column=user")
    assert read.data.group_column == "user"
    assert usage_error(*WORKER, "--dataset=clicks", "--model=wide_deep", "--group_column=query") == (
        "--group_column=query is not a feature of --dataset=clicks (its features: category, hour, item, price, user)")
