"""tf.estimator.experimental.InMemoryEvaluatorHook: evaluation of the model being trained, in the training process,
without a checkpoint.

The hook builds Estimator.evaluate's graph once, in a graph of its own. As the training session is made, every
every_n_iter training runs, and as training ends, it reads the training session's variables and evaluates them:
the evaluation's variables of the same names are set to those values, and its metrics are written to
eval_dir(name) and logged, as Estimator.evaluate writes them. One process only, as TF's: a cluster's variables
live on its ps tasks, and its evaluator reads the chief's checkpoints instead.
"""

import tensorflow as tf

v1 = tf.compat.v1


class InMemoryEvaluatorHook(v1.train.SessionRunHook):
    """Evaluates input_fn's data (over `steps` batches, or all of it) with the variables of the training session,
    at its start, every every_n_iter runs and at its end; `hooks` run in each evaluation."""

    def __init__(self, estimator, input_fn, steps=None, hooks=None, name=None, every_n_iter=100):
        if every_n_iter is None or every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        if estimator.config.num_ps_replicas > 0 or estimator.config.num_worker_replicas > 1:
            raise ValueError("InMemoryEvaluator supports only single machine (aka Local) setting.")
        if steps is not None and steps <= 0:
            raise ValueError(f"InMemoryEvaluatorHook: steps must be positive, not {steps}")
        hooks = list(hooks or ())
        for hook in hooks:
            if not isinstance(hook, v1.train.SessionRunHook):
                raise TypeError(f"All hooks must be SessionRunHook instances, given: {hook}")
        self._estimator, self._input_fn, self._steps, self._hooks, self._name = estimator, input_fn, steps, hooks, name
        self._timer = v1.train.SecondOrStepTimer(every_steps=every_n_iter)

    def begin(self):
        from ps_trainer.estimator.estimator import Evaluation  # noqa: PLC0415  (the package imports this module first)
        from ps_trainer.model.spec import ModeKeys  # noqa: PLC0415  (as above)
        self._timer.reset()
        self._runs = 0
        self._graph = tf.Graph()
        with self._graph.as_default():
            global_step, model, input_hooks, _ = self._estimator._model_graph(self._input_fn, ModeKeys.EVAL)  # noqa: SLF001  (the Estimator's own graph)
            if model.scaffold is not None and model.scaffold.saver is not None:
                raise ValueError("InMemoryEvaluator does not support custom saver")
            if model.scaffold is not None and model.scaffold.init_fn is not None:
                raise ValueError("InMemoryEvaluator does not support custom init_fn")
            self._scaffold = model.scaffold or v1.train.Scaffold()
            self._evaluation = Evaluation.of(global_step, model, input_hooks, self._hooks, self._steps)
            self._evaluated_variables = {variable.op.name: variable for variable in v1.global_variables()}
        self._load = None  # the op that sets them to the training session's values (after_create_session)

    def after_create_session(self, session, coord):
        if v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS):
            raise ValueError("InMemoryEvaluator does not support saveables other than global variables.")
        if self._load is None:  # once: a session made again trains the same graph's variables
            trained = {variable.op.name: variable for variable in v1.global_variables()}
            self._trained = {name: trained[name] for name in self._evaluated_variables if name in trained}
            with self._graph.as_default():
                self._values = {name: v1.placeholder(self._evaluated_variables[name].dtype.base_dtype)
                                for name in self._trained}
                self._load = tf.group([self._evaluated_variables[name].assign(value)
                                       for name, value in self._values.items()])
        self._evaluate(session)

    def after_run(self, run_context, run_values):
        self._runs += 1
        if self._timer.should_trigger_for_step(self._runs):
            self._evaluate(run_context.session)

    def end(self, session):
        self._evaluate(session)

    def _evaluate(self, training_session):
        values = training_session.run(self._trained)
        scaffold = v1.train.Scaffold(init_op=self._load, copy_from_scaffold=self._scaffold,
                                     init_feed_dict={self._values[name]: value for name, value in values.items()})
        with self._graph.as_default():
            creator = v1.train.ChiefSessionCreator(scaffold=scaffold, config=self._estimator.config.session_config)
            self._estimator._evaluated(self._evaluation, creator, self._name)  # noqa: SLF001  (the Estimator's own run)
        self._timer.update_last_triggered_step(self._runs)
