"""Every flag of trainer.py, grouped by concern: define(flag_values) defines them.

A flag that is a setting of the run takes its default from the config dataclass that holds it
(TrainConfig, ModelConfig, DataConfig): each default is written once, there.
"""

from absl import flags

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.training import plan
from ps_trainer.training import optimizers, schedules
from ps_trainer.training.config import TrainConfig

TRAIN, MODEL, DATA = TrainConfig(), model.ModelConfig(), inputs.DataConfig()


def define(flag_values: flags.FlagValues) -> None:
    """Defines every flag of trainer.py on flag_values: absl's FLAGS for trainer.py, a FlagValues of its own for
    the settings an Estimator program is given (ps_trainer/estimator/settings.py). Once per FlagValues: the
    trainer's main and the test support both ask."""
    if "ps_hosts" in flag_values:
        return
    # ---------------------------------------------------------------- cluster
    # Unset, the cluster comes from the environment: TF_CONFIG, SageMaker, Slurm or AWS Batch.
    flags.DEFINE_list("ps_hosts", [], "Comma-separated host:port of every ps task, in task order.",
                      flag_values=flag_values)
    flags.DEFINE_list("worker_hosts", [], "Comma-separated host:port of every worker task.", flag_values=flag_values)
    flags.DEFINE_list("chief_hosts", [], "host:port of a separate chief task; without one, worker 0 is the chief.",
                      flag_values=flag_values)
    flags.DEFINE_enum("job_name", None, ["ps", "worker", "chief", "master", "evaluator"],
                      "Role of this process ('master' is an alias of 'chief'). Leave unset, with no "
                      "hosts and no cluster environment, to train in one process. Set with no host lists and "
                      "no cluster environment, the cluster is mnist_replica's: ps localhost:2222, workers "
                      "localhost:2223,localhost:2224.", flag_values=flag_values)
    flags.DEFINE_integer("task_index", None, "Index of this task within its job; required with --job_name (a task "
                         "that took a default would be a second task 0, a second chief).", lower_bound=0,
                         flag_values=flag_values)
    flags.DEFINE_string("join_address", None, "A worker joining a running asynchronous job: its own host:port, with "
                        "--task_index past --worker_hosts (which stay the job's list, as its other tasks have it). "
                        "Needs the input queue; the ps tasks need not list it. Docs: docs/faults.md#elastic-workers.",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_gpus", None, "GPUs per host: a worker puts its compute on GPU task_index % N (start one "
                         "worker per GPU); 0 keeps workers on the CPU. A ps never uses a GPU. Default: TensorFlow's "
                         "own placement.", lower_bound=0, flag_values=flag_values)
    flags.DEFINE_boolean("thread_spinning", True, "TensorFlow's thread pools spin-wait for work before they sleep (its "
                         "default). --nothread_spinning for tasks that share a host's cores: a spinning task takes "
                         "CPU the others need (scripts/run_local.py sets it when there are more tasks than cores; "
                         "docs/speed.md).", flag_values=flag_values)
    flags.DEFINE_boolean("existing_servers", False, "mnist_replica's flag, accepted as false only: every task of "
                         "ps-trainer starts its own server (run one trainer.py per task).", flag_values=flag_values)
    flags.DEFINE_integer("num_ps", 1, "Slurm and AWS Batch: how many of the tasks are ps tasks.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("port", 2222, "Slurm and AWS Batch: port of the tasks (Slurm adds the local task id).",
                         lower_bound=1, upper_bound=65535, flag_values=flag_values)
    flags.DEFINE_string("rendezvous_dir", None,
                        "AWS Batch: a directory shared by every node, where nodes exchange addresses.",
                        flag_values=flag_values)
    flags.DEFINE_string("advertise_address", None,
                        "AWS Batch: this node's address for the others (default: found from the route).",
                        flag_values=flag_values)
    flags.DEFINE_integer("rendezvous_timeout_secs", 600, "AWS Batch: how long to wait for every node.",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_boolean("allow_public_addresses", False,
                         "Allow publicly routable cluster addresses: only behind a firewall that admits "
                         "just the cluster's hosts (the gRPC port has no authentication).", flag_values=flag_values)
    flags.DEFINE_boolean("skip_own_address_check", False,
                         "Start even when this task's address in the cluster is not one of this host's (behind NAT "
                         "or a proxy); by default that is refused, as the mark of one --task_index on every host.",
                         flag_values=flag_values)

    # ---------------------------------------------------------------- start-up and stalls
    flags.DEFINE_integer("startup_timeout_secs", TRAIN.startup_timeout_secs,
                         "How long a task waits for its peers (ps, chief) before giving up.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("stall_warning_secs", TRAIN.stall_warning_secs,
                         "Warn when a worker completes no step for this long (a peer may be down).",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("stall_timeout_secs", TRAIN.stall_timeout_secs,
                         "Exit (code 138, transient) when a worker completes no step for this long: in sync mode a "
                         "dead worker without a backup stalls every step.", lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("worker_gone_secs", TRAIN.worker_gone_secs,
                         "Once the chief has finished: how long a ps waits for a worker whose address refuses "
                         "connections (it left the job for good, or its host is gone) before it exits without it.",
                         lower_bound=1, flag_values=flag_values)

    # ---------------------------------------------------------------- optimization
    flags.DEFINE_integer("train_steps", TRAIN.train_steps, "Global step at which training stops (with --num_epochs "
                         "and this flag not given: no limit, the epochs end the run).", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("num_epochs", TRAIN.num_epochs, "With --input_queue: end training once this many epochs of "
                         "the training files are trained, every example of each once (0: --train_steps alone ends it).",
                         lower_bound=0, flag_values=flag_values)
    flags.DEFINE_integer("batch_size", TRAIN.batch_size, "Examples per step on each worker.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_float("learning_rate", TRAIN.learning_rate,
                       "Learning rate (the schedule's starting value).", lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_integer("seed", TRAIN.seed, "Seed for initializers, data generation and shuffling.",
                         flag_values=flag_values)

    # ---------------------------------------------------------------- learning rate schedule
    flags.DEFINE_enum("learning_rate_schedule", TRAIN.lr_schedule, sorted(schedules.SCHEDULES),
                      "How the learning rate follows the global step.", flag_values=flag_values)
    flags.DEFINE_integer("decay_steps", None, "exponential, polynomial, cosine: steps of one decay period "
                         "(exponential) or of the whole decay. Default: --train_steps.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_float("decay_rate", TRAIN.decay_rate, "exponential: factor per --decay_steps.", lower_bound=0.0,
                       flag_values=flag_values)
    flags.DEFINE_boolean("staircase", TRAIN.staircase, "exponential: decay in whole periods.", flag_values=flag_values)
    flags.DEFINE_float("end_learning_rate", TRAIN.end_learning_rate,
                       "polynomial and cosine: the rate at the end of the decay.",
                       lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_list("lr_boundaries", [], "piecewise: global steps where the rate changes, increasing.",
                      flag_values=flag_values)
    flags.DEFINE_list("lr_factors", [], "piecewise: --learning_rate times each, one more than --lr_boundaries "
                      "(e.g. 1,0.1,0.01).", flag_values=flag_values)
    flags.DEFINE_integer("warmup_steps", TRAIN.warmup_steps,
                         "A linear warm-up from 0 over this many global steps, before the schedule.",
                         lower_bound=0, flag_values=flag_values)
    flags.DEFINE_boolean("scale_learning_rate_by_replicas", False,
                         "Multiply --learning_rate by the gradients averaged per step (--replicas_to_aggregate in "
                         "sync mode): the linear scaling rule for a larger global batch.", flag_values=flag_values)

    # ---------------------------------------------------------------- optimizer
    flags.DEFINE_float("clip_gradient_norm", None, "Clip the gradients by their global norm to this value.",
                       lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_enum("optimizer", TRAIN.optimizer, sorted(optimizers.OPTIMIZERS),
                      "Optimizer by name. Default: the model's own if it declares one (wide_deep: ftrl_adagrad, "
                      "FTRL for the wide part and Adagrad for the deep part), else momentum.", flag_values=flag_values)
    flags.DEFINE_float("momentum", None, "Momentum for --optimizer=momentum and rmsprop. Default: 0.9 in one "
                       "process or in sync mode; with N asynchronous workers 1 - 0.1 * N, floored at 0 (and past "
                       "the floor the learning rate is divided by 0.1 * N), because stale updates add momentum "
                       "of their own.", lower_bound=0.0, upper_bound=0.999, flag_values=flag_values)

    # ---------------------------------------------------------------- a run that is not learning
    flags.DEFINE_enum("not_learning", TRAIN.not_learning, ["stop", "warn", "off"],
                      "When a worker's training loss stays at chance level (the entropy of the labels it "
                      "saw) for 3 log intervals after a warm-up (a fifth of --train_steps): 'stop' exits 1 "
                      "with the likely cause, 'warn' logs it and trains on.", flag_values=flag_values)

    # ---------------------------------------------------------------- synchronous training
    flags.DEFINE_boolean("sync_replicas", TRAIN.sync_replicas,
                         "Synchronous training: average gradients of all workers each step.", flag_values=flag_values)
    flags.DEFINE_integer("replicas_to_aggregate", None,
                         "With --sync_replicas: gradients per step; fewer than the workers "
                         "makes the rest backup workers. Default: every worker.", lower_bound=1,
                         flag_values=flag_values)

    # ---------------------------------------------------------------- speed levers (training/step/)
    flags.DEFINE_enum("wire_dtype", TRAIN.wire_dtype, ["float32", "bfloat16", "float16"],
                      "Precision of variables and gradients on the wire between workers and ps tasks; the ps "
                      "keeps float32 master copies. bfloat16 halves the bytes of dense variables.",
                      flag_values=flag_values)
    flags.DEFINE_integer("steps_per_run", TRAIN.step_path.steps_per_run,
                         "Training steps in one session.run (a tf.while_loop), which saves the per-run cost of "
                         "the session and its hooks; logging, summaries and checkpoints happen between runs. "
                         "Asynchronous training only.", lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("accumulate_batches", TRAIN.accumulate_batches,
                         "Synchronous training: each worker sums the gradients of this many batches, on one read of "
                         "the variables, and sends their mean to the round: one round trip per N batches. A global "
                         "step is still one round, now of batch_size x N x replicas examples.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("local_steps", TRAIN.local_steps,
                         "Asynchronous training: each worker takes this many steps on its own copy of the dense "
                         "variables, in one session.run, then adds its change, divided by the number of workers, "
                         "to the ps and fetches fresh values (Downpour SGD, averaged): one round trip per N batches. "
                         "A global step still counts one batch. With wide_deep's embedding tables, hashed or dynamic "
                         "(and sgd, adagrad or ftrl_adagrad), a round reads N batches at once and copies their rows "
                         "too: one fetch and one push of rows per ps per round, each row's change added to the ps's "
                         "(dynamic tables admit the round's IDs at its start). Optimizers whose slots decay, and a "
                         "model_fn's tables, keep the tables on the ps, read and updated every step; only the dense "
                         "variables are then copied. 1: a round trip every step.", lower_bound=1,
                         flag_values=flag_values)

    # ---------------------------------------------------------------- checkpoints and logs
    flags.DEFINE_string("model_dir", None, "Directory for checkpoints and summaries; workers resume from it.",
                        flag_values=flag_values)
    flags.DEFINE_integer("save_checkpoint_steps", None,
                         "Save a checkpoint every N global steps (instead of --save_checkpoint_secs).",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("save_checkpoint_secs", TRAIN.save_checkpoint_secs,
                         "Save a checkpoint every N seconds.", lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("incremental_save_secs", TRAIN.incremental_save_secs,
                         "Between full checkpoints, save every N seconds a delta: the embedding table rows changed "
                         "since the last save, and every other variable whole (model.ckpt-<full step>-delta-<step>). "
                         "A restore is the last full checkpoint plus its deltas. 0: full checkpoints only.",
                         lower_bound=0, flag_values=flag_values)
    flags.DEFINE_string("warm_start_from", None,
                        "A model_dir or a checkpoint: a run that starts (model_dir holds no checkpoint) loads every "
                        "model variable whose name and shape match from it; the global step, the optimizer's slots "
                        "and the input start fresh; dynamic tables load by ID (re-cut into this run's shards and "
                        "capacity). The ps tasks read it: give a path they can read.", flag_values=flag_values)
    flags.DEFINE_list("warm_start_map", [],
                      "OLD=NEW,...: with --warm_start_from, this model's variables named NEW or under NEW/ load the "
                      "checkpoint's OLD ones (a renamed column or scope).", flag_values=flag_values)
    flags.DEFINE_boolean("warm_start_slots", TRAIN.warm_start_slots,
                         "With --warm_start_from, also load the optimizer's slots of the variables loaded (an "
                         "optimizer of the same kind): the first steps then go on as the source run's would have.",
                         flag_values=flag_values)
    flags.DEFINE_integer("keep_checkpoint_max", TRAIN.keep_checkpoint_max,
                         "Newest checkpoints to keep; older ones are deleted.",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_boolean("save_graph_def", TRAIN.save_graph_def,
                         "The chief writes the graph as graph.pbtxt into --model_dir and a .meta beside each "
                         "checkpoint (tf.compat.v1.train.import_meta_graph reads it); --nosave_graph_def writes "
                         "neither.",
                         flag_values=flag_values)
    flags.DEFINE_integer("save_summaries_steps", TRAIN.save_summaries_steps,
                         "Write summaries every N global steps (chief only).",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("log_every_n_steps", TRAIN.log_every_n_steps,
                         "Log progress every N local steps on each worker.",
                         lower_bound=1, flag_values=flag_values)

    flags.DEFINE_boolean("export_saved_model", TRAIN.export_saved_model,
                         "At the end of training the chief writes <model_dir>/export/<step>, a SavedModel "
                         "serving raw features.", flag_values=flag_values)
    flags.DEFINE_list("profile_steps", [], "FIRST,LAST: trace these local steps on each worker into "
                      "<model_dir>/profile/<task> for TensorBoard's profiler, e.g. 100,110.", flag_values=flag_values)
    flags.DEFINE_integer("metrics_port", TRAIN.metrics_port,
                         "Serve live metrics in Prometheus's text format at http://<this task's host>:PORT/metrics "
                         "(the global step, examples/s, loss, staleness, held-out figures, ps variable bytes); "
                         "0: off. It listens on the task's own cluster address only (127.0.0.1 in one process).",
                         lower_bound=0, upper_bound=65535, flag_values=flag_values)
    flags.DEFINE_integer("eval_timeout_secs", TRAIN.eval_timeout_secs,
                         "Evaluator: give up if no new checkpoint appears for this long.", lower_bound=1,
                         flag_values=flag_values)

    # ---------------------------------------------------------------- model and data
    flags.DEFINE_enum("model", MODEL.name, sorted(model.MODELS), "Model by name (model_fn: --model_fn's).",
                      flag_values=flag_values)
    flags.DEFINE_string("model_fn", MODEL.model_fn, "A TF1 Estimator model_fn to train, FILE.py:FUNCTION: it returns "
                        "an EstimatorSpec with its loss and its logits as predictions, and no train_op (the runtime "
                        "makes the update, with the levers); features by name from --dataset (model/user_fn.py).",
                        flag_values=flag_values)
    flags.DEFINE_list("model_fn_params", [], "--model_fn's params, key=value pairs (values read as Python literals "
                      "where they are: numbers, lists, True).", flag_values=flag_values)
    flags.DEFINE_list("hidden_units", [str(units) for units in MODEL.hidden_units],
                      "Hidden layer sizes (mlp, wide_deep), comma-separated.", flag_values=flag_values)
    flags.DEFINE_integer("hash_buckets", MODEL.hash_buckets, "wide_deep: rows of each categorical feature's hashed "
                         "embedding table (1000000 with --embedding_dim=32 is 128 MB per table).", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("embedding_dim", MODEL.embedding_dim, "wide_deep: width of the embeddings.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_integer("embedding_partitions", None, "wide_deep: shards each table is cut into "
                         "(fixed_size_partitioner; dynamic tables by a hash of the ID). Default: tables whole, spread "
                         "over the ps tasks (hashed ones by size), one shard per ps when there are too few tables to "
                         "spread evenly; a dynamic run resumes with its checkpoint's shards.", lower_bound=1,
                         flag_values=flag_values)
    flags.DEFINE_enum("embedding", MODEL.embedding, ["hashed", "dynamic"],
                      "wide_deep: 'hashed' tables of --hash_buckets rows (distinct values may share a row), or "
                      "'dynamic': a row of its own for each raw value, made when training first meets it, cut "
                      "over the ps tasks by a hash of the value.", flag_values=flag_values)
    flags.DEFINE_integer("embedding_capacity", MODEL.embedding_capacity,
                         "--embedding=dynamic: the rows each table can hold, over all its shards: allocated up front, "
                         "or with --embedding_growth the limit its storage grows to; a table that fills up stops "
                         "training with a message naming it.", lower_bound=2, flag_values=flag_values)
    flags.DEFINE_bool("embedding_growth", MODEL.embedding_growth,
                      "--embedding=dynamic: each table's storage starts small and grows with the values training "
                      "meets, up to --embedding_capacity (which a resume may then raise), instead of holding "
                      "--embedding_capacity rows from the start. Memory follows the live rows; a step costs more "
                      "(docs/data.md).", flag_values=flag_values)
    flags.DEFINE_integer("embedding_steps_to_live", MODEL.embedding_steps_to_live,
                         "--embedding=dynamic: before each checkpoint the chief evicts the values whose rows no "
                         "training step read in this many global steps (their rows are reset and reused); 0: never.",
                         lower_bound=0, flag_values=flag_values)
    flags.DEFINE_integer("embedding_min_count", MODEL.embedding_min_count,
                         "--embedding=dynamic: a value gets a row of its own at its Nth occurrence in training; "
                         "before that it reads and trains the table's shared default row.",
                         lower_bound=1, flag_values=flag_values)
    flags.DEFINE_enum("dataset", DATA.name, sorted(inputs.DATASETS),
                      "Data source by name; 'synthetic' (images), 'clicks' and 'zipf_clicks' (tabular; the "
                      "latter Criteo-shaped with Zipf-distributed IDs, for embedding benchmarks) are generated and "
                      "need no files; 'tfrecord', 'csv', 'idx' and 'criteo' (Criteo's tab-separated click logs) "
                      "read --data_dir.", flag_values=flag_values)
    flags.DEFINE_string("eval_data_dir", None, "Held-out data for the evaluator, in the same format. "
                        "Default: the eval split in --data_dir (eval-*.tfrecord, eval-*.csv, t10k-* for idx).",
                        flag_values=flag_values)
    flags.DEFINE_string("group_column", None, "The held-out evaluations also report the group AUC (GAUC): the "
                        "mean of the AUCs of each value of this feature (a user, a query), weighted by its examples; "
                        "groups of one class are skipped and counted. A feature of the dataset, e.g. user on clicks.",
                        flag_values=flag_values)
    flags.DEFINE_string("label_column", DATA.label_column, "csv and tabular tfrecord: the int64 class column.",
                        flag_values=flag_values)
    flags.DEFINE_list("numeric_columns", [], "csv and tabular tfrecord: float feature columns.",
                      flag_values=flag_values)
    flags.DEFINE_list("categorical_columns", [], "csv and tabular tfrecord: string feature columns.",
                      flag_values=flag_values)
    flags.DEFINE_list("multi_valued_columns", [], "NAME[:SEPARATOR],...: categorical columns of any number of values "
                      "per example (a user's last items: a|b|c; SEPARATOR default '|'), on csv files, on tfrecord "
                      "(a bytes or int64 list, any length), and 'history' on zipf_clicks (generated). wide_deep "
                      "looks each value up and combines an example's rows by --combiner; an empty field is no value.",
                      flag_values=flag_values)
    flags.DEFINE_enum("combiner", MODEL.combiner, ["sum", "mean", "sqrtn"],
                      "wide_deep: how a multi-valued column's embeddings of one example combine (sqrtn: the sum over "
                      "the square root of their count); the wide part's weights add up.", flag_values=flag_values)
    flags.DEFINE_float("numeric_default", DATA.numeric_default,
                       "csv and criteo: the value an empty numeric field reads as (an empty categorical field "
                       "reads as the empty string, an id of its own).", flag_values=flag_values)
    flags.DEFINE_integer("num_classes", DATA.num_classes, "csv and tabular tfrecord: labels are 0..num_classes-1.",
                         lower_bound=2, flag_values=flag_values)
    flags.DEFINE_boolean("skip_bad_records", DATA.skip_bad_records,
                         "Skip unreadable or invalid records, logging and counting each, instead of "
                         "stopping at the first with an error naming its file and record.", flag_values=flag_values)
    flags.DEFINE_string("data_dir", None, "Directory of the data, for file-based datasets. With the default "
                        "--dataset, its format is found from its files (train-*.tfrecord, train-*.csv, MNIST's "
                        "IDX files). Default on SageMaker: the training channel (SM_CHANNEL_TRAINING).",
                        flag_values=flag_values)
    flags.DEFINE_boolean("download_only", False, "Download MNIST's four IDX files into --data_dir (mirrors tried in "
                         "turn, checksums verified, partial downloads resumed) and exit; then train with "
                         "--data_dir, as mnist_replica.", flag_values=flag_values)
    flags.DEFINE_boolean("input_queue", None,
                         "Hand the training files out to the workers from a work queue on ps 0, a file at a time, "
                         "instead of a fixed shard each: a fast worker reads more files, each file of an epoch is "
                         "trained once (a killed worker's files go to the others), and where the epoch stands is "
                         "saved in the checkpoints. On csv, tfrecord or criteo files, asynchronous or sync. "
                         + plan.QUEUE_HELP, flag_values=flag_values)
    flags.DEFINE_boolean("input_queue_audit", DATA.input_queue_audit,
                         "--input_queue: each worker also writes the (epoch, file, record) of every example it "
                         "trains to <model_dir>/workers/<task>/trained_examples.bin (int64 triples, 24 bytes an "
                         "example), which scripts/inject_fault.py counts per epoch: an audit, or a benchmark mode.",
                         flag_values=flag_values)
    flags.DEFINE_integer("input_queue_lease_secs", DATA.input_queue_lease_secs,
                         "--input_queue: a worker silent this long (dead, not restarted) loses the files it held to "
                         "the other workers.", lower_bound=1, flag_values=flag_values)
    flags.DEFINE_integer("shuffle_buffer", DATA.shuffle_buffer,
                         "Training examples each worker shuffles among (tf.data's shuffle buffer): more mixes batches "
                         "better and holds more in memory. With --input_queue, also the most examples of a file "
                         "that can be trained again after its reader is killed (those trained past the file's "
                         "trained prefix).", lower_bound=1, flag_values=flag_values)
    flags.DEFINE_string("cache", None, "What a worker keeps of the examples it reads: 'none' (streamed: memory holds "
                        "the shuffle buffer, not the data), 'memory' (its whole shard, decoded, in RAM after the "
                        "first epoch) or a directory (the shard written there in the first epoch, about its size on "
                        "disk, and reread after). Default: memory for the generated datasets, none for files.",
                        flag_values=flag_values)
    flags.DEFINE_integer("synthetic_examples", DATA.synthetic_examples, "Training examples in the synthetic dataset.",
                         lower_bound=1, flag_values=flag_values)
