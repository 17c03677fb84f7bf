"""The training session loop of both front doors: MonitoredTrainingSessions one after another until training
is over, through ps restarts and sessions that end early; a non-chief first waits for the chief to have the
variables ready. The only module that makes training sessions.

The worker role (training/worker.py) and an Estimator program's train (ps_trainer/estimator/) describe their
sessions (Sessions) and call train_to_the_end, which returns where training ended (Ended).
"""

import os
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf
from absl import logging
from tensorflow.python.framework import meta_graph  # create_meta_graph_def, as CheckpointSaverHook writes it
from tensorflow.python.lib.io import file_io  # atomic_write_string_to_file, as TensorFlow's write_graph writes
from tensorflow.python.training import training_util  # GLOBAL_STEP_READ_KEY: the collection of TF's cached read

from ps_trainer.cluster import shutdown
from ps_trainer.cluster.clock import SYSTEM
from ps_trainer.input import work_queue
from ps_trainer.training import exit_codes, log_lines
from ps_trainer.training.ending import CLUSTER_ERRORS
from ps_trainer.training.step import sync

v1 = tf.compat.v1

CHIEF_POLL_SECS = 0.5
# A non-chief's MonitoredTrainingSession gives up at once when the variables are not ready
# (below SessionManager's 30 s poll); see _one_session.
NOT_READY_RETRY_SECS = 1
SESSION_NOT_READY = "Session was not ready"
# Sessions in a row that may end short of --train_steps with no step done before the worker gives up.
MAX_EARLY_ENDS = 10


class Ended(NamedTuple):
    """Where training ended: the global step reached, and the step it was to end at (--train_steps, or where
    the input queue's epochs ended)."""
    global_step: int
    last_step: int


class Sessions(NamedTuple):
    """What each training session of a task is made of, as its front door built it."""
    train_op: object  # what each run fetches
    scaffold: v1.train.Scaffold  # with the chief's saver (training/checkpoints.LiveStateSaver)
    hooks: list
    chief_only_hooks: list
    # checkpoints.report_uninitialized() of the graph, built beforehand (a MonitoredTrainingSession that
    # failed can leave the graph finalized): a non-chief's wait for the chief runs it.
    uninitialized: tf.Tensor
    config: v1.ConfigProto
    # A hook whose `global_step` is the global step when its session began, and after each session.
    progress: v1.train.SessionRunHook
    input_queue: object = None  # the input queue's hook (training/queue_hook.py), if the input comes from one
    not_learning: object = None  # training/learning.NotLearningHook: training ends once it fails
    # Why this non-chief cannot train beside the chief's run (training/run_record.peer_refusal), or None.
    peer_refusal: Callable[[], str | None] | None = None
    # TF1's Estimator: a session that ends (its input's end, a hook's stop request) ends training; for
    # the trainer only the global step does, and such a session is followed by a new one.
    ends_with_session: bool = False
    log_step_count_steps: int = 0  # MonitoredTrainingSession's global_step/sec lines and summaries
    saving_listeners: tuple = ()  # an Estimator program's CheckpointSaverListeners, called around the chief's saves


class GlobalStepAtEnds(v1.train.SessionRunHook):
    """Sessions.progress for a front door that logs its own progress: the global step read when each
    session begins and when it ends, not each step (a read each step adds a round trip to the ps); and the
    runtime's first-step line (training/log_lines.py), from the first run of this task's start, and its line
    for each training session made again, through `log` (the front door's logger)."""

    def __init__(self, task_name: str, loss, log):
        self.global_step = 0
        self._task_name, self._loss, self._log, self._first = task_name, loss, log, True
        self._sessions = 0  # training sessions made: more than one when MonitoredSession made one again

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self.global_step = int(session.run(self._global_step))
        self._sessions += 1
        if self._sessions > 1:
            log_lines.log_session_again(self._task_name, self.global_step, self._log)

    def before_run(self, run_context):
        if self._first:
            return v1.train.SessionRunArgs({"global_step": self._global_step, "loss": self._loss})
        return None

    def after_run(self, run_context, run_values):
        if self._first:
            self._first = False
            log_lines.log_first_step(self._task_name, int(run_values.results["global_step"]) + 1,
                                     float(run_values.results["loss"]), self._log)

    def end(self, session):
        self.global_step = int(session.run(self._global_step))


class _Session(NamedTuple):
    ready: bool  # False: a non-chief found the variables not ready, and waits for the chief again
    over_at: int | None = None  # training was over before the session began: the global step it ended at
    cancelled: bool = False  # a step was cancelled: the session ended for a failure, not at its end
    # Its steps were done and its end (the hooks' end(): the chief's final save) failed as a task was lost: what
    # the ps tasks hold is unknown, and only a new session says where training is.
    end_failed: bool = False


def train_to_the_end(cfg, target, sessions: Sessions, stop=None, clock=SYSTEM) -> Ended:
    """Sessions one after another until the global step reaches --train_steps, a stop is requested or
    the run is found not learning: a session ends early when a ps restarts or the input ends. Its waits
    are on `clock` (cluster/clock.py)."""
    cluster, train_cfg, progress = cfg.cluster, cfg.train, sessions.progress
    early_ends = 0
    reached = progress.global_step
    plain_global_step_read()
    saves = chief_saver_hook(train_cfg, sessions) if cluster.is_chief else None
    failed_ends = 0
    while True:
        start_step = reached
        session = _one_session(cfg, target, sessions, saves, clock)
        if not session.ready:
            logging.info("%s: the variables on the ps are not initialized (did a ps task restart?); "
                         "waiting for the chief to restore them", cluster.task_name)
            continue
        # A session whose end failed says nothing of where training is: the next one does (unless a stop was
        # requested, or its end failed MAX_EARLY_ENDS times in a row: the checks below judge what the last one left).
        failed_ends = failed_ends + 1 if session.end_failed else 0
        if 0 < failed_ends < MAX_EARLY_ENDS and not (stop and stop.requested.is_set()):
            continue
        reached = progress.global_step if session.over_at is None else session.over_at
        not_learning = sessions.not_learning
        if ((stop and stop.requested.is_set()) or (not_learning and not_learning.failure)
                or reached >= train_cfg.train_steps):
            return Ended(reached, train_cfg.train_steps)
        if sessions.ends_with_session and not session.cancelled:
            return Ended(reached, reached)
        if sessions.input_queue and _all_epochs_done(sessions.input_queue.feed):
            now = _global_step_now(target, sessions.config)
            logging.info("%s: input queue: all %d epoch(s) trained; training ends at global step %d",
                         cluster.task_name, train_cfg.num_epochs, now)
            return Ended(now, now)
        # Only the global step says training is over. A session can end short of it with no
        # error: an OutOfRangeError (a closed queue, an input that ran out) ends a
        # MonitoredSession as cleanly as the last step does.
        early_ends = early_ends + 1 if reached == start_step else 0
        if early_ends >= MAX_EARLY_ENDS:
            raise exit_codes.Failure(
                f"{cluster.task_name}: {early_ends} sessions in a row ended at global step "
                f"{reached} with no step done, short of --train_steps={train_cfg.train_steps} "
                "(an input that ends, or a queue closed); giving up", exit_codes.INPUT_ENDED)
        logging.warning("%s: the session ended at global step %s, short of --train_steps=%d; starting a "
                        "new one", cluster.task_name, reached, train_cfg.train_steps)
        clock.sleep(CHIEF_POLL_SECS)


def plain_global_step_read(graph=None) -> None:
    """Makes the default graph's cached read of the global step (training_util's, which StopAtStepHook,
    CheckpointSaverHook, StepCounterHook and SummarySaverHook fetch with every run) a plain read of the variable.

    Left to TensorFlow, the read is a cond on the variable being initialized, under TF 2.x's control flow an If
    op whose branch reads the variable on its ps: a function run across the worker and the ps at every step,
    ~1 ms of the ps's CPU a step on a small model (docs/estimator.md). A training session runs only once the
    variables are initialized (the chief initialized or restored them; a non-chief waited for it), so the
    cond has nothing to guard. A graph already finalized, or whose read is made, is left as it is."""
    graph = graph or v1.get_default_graph()
    global_step = v1.train.get_global_step(graph)
    if global_step is None or graph.finalized or graph.get_collection(training_util.GLOBAL_STEP_READ_KEY):
        return
    with graph.as_default(), graph.name_scope(None), graph.name_scope(global_step.op.name + "/"):
        graph.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, global_step.read_value() + 0)


class ChiefSaverHook(v1.train.CheckpointSaverHook):
    """The chief's saves: TensorFlow's CheckpointSaverHook, told how many global steps a run of this task takes at
    most, which writes the graph (graph.pbtxt, and the graph and meta graph in model_dir's events file) with the
    task's first session only.

    Left to its default (a million steps a run), the hook reads the global step from its ps in a run of its own
    after every run once saves go by steps: a round trip a step, a quarter of a small model's steps on a cluster
    (docs/estimator.md, against a bare loop). Told the truth, it reads the global step only when the step it
    fetched with the run, plus this run's steps, reaches the next save; the steps of other workers since can put a
    save one run later than that step.

    TensorFlow's hook writes the graph again each time a session is made, and a session is made again after
    every ps restart, with the same finalized graph: each copy in the events file adds the graph's size to it.
    A session made again still saves a checkpoint of the step it starts at, as TensorFlow's does.

    graph.pbtxt holds what TensorFlow's hook writes there (the GraphDef with its shapes, in protobuf's text
    format), printed by protobuf's own encoder (str()) where TensorFlow's write_graph prints it with
    text_format.MessageToString, in Python: for a wide & deep on 5 Criteo ID columns and a history as dynamic
    tables in rounds of rows (9,400 ops, a 10 MB graph.pbtxt), 1.5 s of the chief's CPU against 0.4 s.
    The two texts parse to the same GraphDef; they differ in the order of each node's attributes (text_format
    sorts them by name) and in how a float is spelt (0.0 or 0, -0.6324555 or -0.632455528).
    save_graph_def=False (RunConfig's checkpoint_save_graph_def) writes no graph.pbtxt and no .meta beside each
    checkpoint."""

    def __init__(self, model_dir, save_secs, save_steps, scaffold, listeners=None, steps_per_run: int = 1,
                 save_graph_def: bool = True):
        super().__init__(model_dir, save_secs=save_secs, save_steps=save_steps, scaffold=scaffold,
                         listeners=listeners, save_graph_def=save_graph_def)
        self._set_steps_per_run(steps_per_run)  # TensorFlow's own setter, as TPUEstimator calls it
        self._graph_written = False

    def after_create_session(self, session, coord):
        global_step = session.run(self._global_step_tensor)
        if not self._graph_written:
            self._write_graph()
        self._save(session, global_step)
        self._timer.update_last_triggered_step(global_step)
        self._graph_written = True  # once written and saved: a first session that failed writes it again

    def _write_graph(self) -> None:
        """What TensorFlow's hook writes when a session is made: graph.pbtxt (see the class), and the graph and
        its meta graph in model_dir's events file."""
        graph = v1.get_default_graph()
        graph_def = graph.as_graph_def(add_shapes=True)
        if self._save_graph_def:
            tf.io.gfile.makedirs(self._checkpoint_dir)
            file_io.atomic_write_string_to_file(os.path.join(self._checkpoint_dir, "graph.pbtxt"), str(graph_def))
        saver = self._get_saver()
        self._summary_writer.add_graph(graph)
        self._summary_writer.add_meta_graph(meta_graph.create_meta_graph_def(
            graph_def=graph_def, saver_def=saver.saver_def if saver else None))


def chief_saver_hook(train_cfg, sessions: Sessions) -> ChiefSaverHook | None:
    """The chief's saves by --save_checkpoint_steps or _secs, one hook for all of the task's sessions; None when
    neither is set, or when an Estimator program's hooks hold a CheckpointSaverHook of its own: that one saves in
    its place (begin_once gave it the program's saving listeners)."""
    if own_saver_hook([*sessions.hooks, *sessions.chief_only_hooks]) is not None:
        return None
    steps, secs = train_cfg.save_checkpoint_steps, train_cfg.save_checkpoint_secs
    if not steps and not secs:
        return None
    return ChiefSaverHook(train_cfg.model_dir, None if steps else secs, steps or None, sessions.scaffold,
                          list(sessions.saving_listeners), train_cfg.step_path.steps_per_run, train_cfg.save_graph_def)


def own_saver_hook(hooks) -> v1.train.CheckpointSaverHook | None:
    """The first CheckpointSaverHook among an Estimator program's hooks, which saves in place of the runtime's."""
    hooks = (hook.hook if isinstance(hook, BegunHook) else hook for hook in hooks)
    return next((hook for hook in hooks if isinstance(hook, v1.train.CheckpointSaverHook)), None)


class BegunHook(v1.train.SessionRunHook):
    """A program's hook whose begin() has run (begin_once): every training session of the task calls the rest
    of it, and not begin() again."""

    def __init__(self, hook):
        self.hook = hook

    def after_create_session(self, session, coord):
        self.hook.after_create_session(session, coord)

    def before_run(self, run_context):
        return self.hook.before_run(run_context)

    def after_run(self, run_context, run_values):
        self.hook.after_run(run_context, run_values)

    def end(self, session):
        self.hook.end(session)


def begin_once(hooks, saving_listeners=()) -> list[BegunHook]:
    """Runs an Estimator program's hooks' begin(), in the graph and device scope of the caller, which must come
    before the graph's saver and its report of uninitialized variables are made; returns them for the task's
    sessions, which do not begin them again. TF's Estimator made one MonitoredSession per train(), which begins its
    hooks once however often it makes its session again, inside the graph's device function: a hook that makes a
    variable or an op in begin() (TF's early-stopping hooks) has it on a ps, saved in every checkpoint, and is not
    asked to make it again in the finalized graph of a later session. The program's own CheckpointSaverHook, if
    any, is first given the saving listeners (its begin() begins them), as TF's Estimator gave them to it."""
    own = own_saver_hook(hooks)
    if own is not None:
        own._listeners.extend(saving_listeners)  # noqa: SLF001  (as TF's Estimator gave them to it)
    plain_global_step_read()  # before any hook's begin() makes TF's cached read (SummarySaverHook's does)
    for hook in hooks:
        hook.begin()
    return [BegunHook(hook) for hook in hooks]


def _one_session(cfg, target, sessions: Sessions, saves: ChiefSaverHook | None, clock) -> _Session:
    """Trains in one MonitoredTrainingSession until the end or a stop request.

    A non-chief's MonitoredTrainingSession re-creates its session after a ps restarts, and then
    waits for the chief to restore the variables, polling every 30 s. With max_wait_secs under
    that poll, its first not-ready check raises DeadlineExceededError instead: this worker polls
    with wait_for_chief_ready and enters a new session (the hooks and scaffold are reused).
    """
    cluster, train_cfg, progress = cfg.cluster, cfg.train, sessions.progress
    if not cluster.is_chief:
        over = wait_for_chief_ready(target, sessions.config, train_cfg.startup_timeout_secs, cluster.task_name,
                                    sessions.uninitialized, train_cfg, clock)
        if over is not None:
            return _Session(ready=True, over_at=over)
        # The chief's record of its run is written before it initializes the variables this worker waited for.
        refusal = sessions.peer_refusal() if sessions.peer_refusal else None
        if refusal:
            raise exit_codes.Failure(f"{cluster.task_name}: {refusal}", exit_codes.BAD_FLAGS)
    steps_done = False
    try:
        with v1.train.MonitoredTrainingSession(
                master=target,
                is_chief=cluster.is_chief,
                checkpoint_dir=train_cfg.model_dir,
                hooks=sessions.hooks,
                chief_only_hooks=[*sessions.chief_only_hooks, *([saves] if saves else [])],
                scaffold=sessions.scaffold,
                save_checkpoint_steps=None,  # the runtime's own hook (ChiefSaverHook) saves
                save_checkpoint_secs=None,
                save_summaries_steps=train_cfg.save_summaries_steps,
                save_summaries_secs=None,
                log_step_count_steps=sessions.log_step_count_steps,
                config=sessions.config,
                max_wait_secs=train_cfg.startup_timeout_secs if cluster.is_chief else NOT_READY_RETRY_SECS,
                stop_grace_period_secs=sync.STOP_GRACE_SECS if train_cfg.sync_replicas else 10,
        ) as sess:
            # StopAtStepHook looks only after a step: a worker (re)started once training is over
            # would push one more update. ProgressHook read the global step when the session began.
            # After that StopAtStepHook alone decides: it reads the variable itself, where
            # ProgressHook's per-step figure is an estimate (in sync mode a step can return before
            # the chief's queue runner has applied that round).
            if progress.global_step < train_cfg.train_steps:
                while not sess.should_stop():
                    sess.run(sessions.train_op)
            steps_done = True
    except (*CLUSTER_ERRORS, tf.errors.CancelledError) as err:
        if steps_done and cluster.is_distributed:
            # The session's end (its hooks' end(): the chief's final save, a read of the global step) met a lost
            # task, where MonitoredSession makes no new session as it does for an error in a step. A ps restarted
            # since has lost what was trained after the newest checkpoint: the chief's new session restores it
            # and trains again, and a worker's waits for that restore and trains beside it; a ps that kept its
            # state is taken as it is.
            logging.warning("%s: a task was lost as the session ended (%s); making a new session, which trains on "
                            "to the end from what the ps tasks hold", cluster.task_name,
                            log_lines.error_cause(err.message))
            return _Session(ready=True, end_failed=True)
        if isinstance(err, tf.errors.DeadlineExceededError):
            if cluster.is_chief or SESSION_NOT_READY not in err.message:
                raise
            return _Session(ready=False)
        if not isinstance(err, tf.errors.CancelledError) or not cluster.is_distributed:
            raise
        # MonitoredSession recreates its session on Aborted and Unavailable only. When a ps task
        # restarts mid-step, the step can end Cancelled instead (a receive cancelled because the ps
        # aborted a request it saw twice, seen in the chaos soak): the same recoverable failure.
        logging.warning("%s: a step was cancelled (a ps task or the network failed mid-step); starting a new "
                        "session", cluster.task_name)
        return _Session(ready=True, cancelled=True)
    return _Session(ready=True)


def wait_for_chief_ready(target, session_config, timeout_secs, task_name, uninitialized,
                         train_cfg=None, clock=SYSTEM) -> int | None:
    """Polls until the chief has initialized or restored the variables, every CHIEF_POLL_SECS of `clock`
    (cluster/clock.py); past `timeout_secs` (--startup_timeout_secs), raises Failure (CHIEF_NOT_READY).
    Returns None then, or the final global step if training turns out to be over already (the
    global step is at --train_steps, or the chief's done mark says so): a worker restarted after the
    end, when a ps has restarted too, would otherwise wait for a chief that is gone.

    MonitoredTrainingSession's own wait for non-chief workers polls every 30 s; entering it once the
    variables are ready means its first check passes. `uninitialized`: checkpoints.report_uninitialized()
    of the graph, built beforehand (a MonitoredTrainingSession that failed can leave the graph finalized).
    """
    global_step = v1.train.get_global_step()
    start = last_log = clock()
    while True:
        try:
            with v1.Session(target, config=session_config) as sess:
                while True:
                    names = sess.run(uninitialized)
                    if not len(names):
                        return None
                    if train_cfg is not None:
                        over = _training_over(sess, names, global_step, train_cfg)
                        if over is not None:
                            logging.info("%s: training is over (global step %d); not waiting for the chief",
                                         task_name, over)
                            return over
                    now = clock()
                    if now - start > timeout_secs:
                        raise exit_codes.Failure(
                            f"{task_name}: the chief did not initialize the variables within {timeout_secs} s "
                            "(--startup_timeout_secs); is the chief task running?", exit_codes.CHIEF_NOT_READY)
                    if now - last_log >= 10:
                        logging.info("%s: waiting for the chief to initialize %d variables", task_name, len(names))
                        last_log = now
                    clock.sleep(CHIEF_POLL_SECS)
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as err:
            # A ps task down while this worker waits (the chaos drill: a second ps killed while the
            # chief restored the first): the chief waits for it as well. A poll under way when the ps
            # went down can end Cancelled ("RecvFromRemoteAsync is cancelled", seen on a loaded
            # machine), as a step can. Past the timeout, this reaches the top: a transient exit.
            if clock() - start > timeout_secs:
                raise
            logging.info("%s: a ps task did not answer while waiting for the chief (%s); asking again",
                         task_name, log_lines.error_cause(err.message, 120))
            clock.sleep(CHIEF_POLL_SECS)


def _training_over(sess, uninitialized_names, global_step, train_cfg) -> int | None:
    if global_step is not None and global_step.op.name.encode() not in set(uninitialized_names):
        step = int(sess.run(global_step))
        if step >= train_cfg.train_steps:
            return step
    return shutdown.chief_finished_step(train_cfg.model_dir, train_cfg.train_steps, train_cfg.num_epochs)


def _all_epochs_done(feed: work_queue.ItemFeed) -> bool:
    """--input_queue: every epoch is done (a sync worker can be woken by the end before its input saw it)."""
    try:
        return feed.all_done()
    except work_queue.RETRYABLE:  # ps 0 restarting: the next session asks again
        return False


def _global_step_now(target, config) -> int:
    """The global step as the ps holds it (the progress hook's figure is this worker's last step's)."""
    with v1.Session(target, config=config) as sess:
        return int(sess.run(v1.train.get_global_step()))
