"""The run's two paths (training/plan.py): the input path from its rules, and the step path from the
levers, each decided once from plain settings; a TrainConfig built from a step path reads back as it."""

import dataclasses
import re

import pytest

from ps_trainer.training import plan, step
from ps_trainer.training.config import TrainConfig

pytestmark = pytest.mark.pure

FILES_IN_A_CLUSTER = plan.InputSettings(dataset="csv", has_files=True, distributed=True)
# Each rule's settings, from files in a cluster: the rule that holds there, and only it.
BLOCKED = {
    "lever": dict(several_batches=("local_steps", 10)),
    "cache": dict(cache="memory"),
    "backup": dict(backup_workers=(1, 2)),
    "files": dict(dataset="synthetic", has_files=False),
    "one process": dict(distributed=False),
}


def test_files_in_a_cluster_take_the_queue_by_default_and_as_asked():
    assert plan.input_path(FILES_IN_A_CLUSTER) == plan.InputPath(queue=True, by_default=True)
    assert plan.input_path(dataclasses.replace(FILES_IN_A_CLUSTER, input_queue=True)) == plan.InputPath(queue=True)
    assert plan.input_path(dataclasses.replace(FILES_IN_A_CLUSTER, input_queue=False)) == plan.InputPath(queue=False)


@pytest.mark.parametrize("blocked", BLOCKED.values(), ids=BLOCKED.keys())
def test_each_rule_gives_the_default_its_reason_and_refuses_the_queue_asked_for(blocked):
    settings = dataclasses.replace(FILES_IN_A_CLUSTER, **blocked)
    [rule] = [rule for rule in plan.QUEUE_RULES if rule.holds(settings)]
    assert plan.input_path(settings) == plan.InputPath(queue=False, reason=rule.reason(settings))
    with pytest.raises(plan.Conflict, match="^" + re.escape(rule.refusal(settings)) + "$"):
        plan.input_path(dataclasses.replace(settings, input_queue=True))
    needing = dataclasses.replace(settings, needs_queue="num_epochs")
    with pytest.raises(plan.Conflict) as error:
        plan.input_path(needing)
    assert str(error.value) == (f"--num_epochs needs the input queue, and this run cannot use it: "
                                f"{rule.reason(settings)}.")


def test_the_flags_alone_check_only_the_rules_they_know_and_the_first_that_holds_speaks():
    flags_alone = plan.InputSettings(input_queue=True)  # no dataset, no cluster yet
    plan.check_input(flags_alone)
    with pytest.raises(plan.Conflict, match="drop --cache=memory"):
        plan.check_input(dataclasses.replace(flags_alone, cache="memory"))
    with pytest.raises(plan.Conflict, match="drop --steps_per_run=4"):
        plan.check_input(dataclasses.replace(flags_alone, cache="memory", several_batches=("steps_per_run", 4)))
    with pytest.raises(plan.Conflict, match="drop --noinput_queue"):
        plan.check_input(plan.InputSettings(input_queue=False, needs_queue="input_queue_audit"))


def test_a_joining_worker_needs_the_queue_and_is_told_why_it_has_none():
    joining = dataclasses.replace(FILES_IN_A_CLUSTER, joins=True)
    assert plan.input_path(joining).queue
    with pytest.raises(plan.Conflict, match="; drop --noinput_queue.$"):
        plan.input_path(dataclasses.replace(joining, input_queue=False))
    with pytest.raises(plan.Conflict, match="this run cannot use it: --cache=memory keeps a fixed shard.$"):
        plan.input_path(dataclasses.replace(joining, cache="memory"))


def test_a_default_queue_gives_way_on_resume_to_a_checkpoint_of_fixed_shards_and_an_asked_one_does_not():
    default, asked = plan.InputPath(queue=True, by_default=True), plan.InputPath(queue=True)
    assert not plan.settled_input(default, saved_without_queue=True).queue
    assert plan.settled_input(default, saved_without_queue=False) == default
    assert plan.settled_input(asked, saved_without_queue=True) == asked


def test_the_help_names_every_rule_a_flag_can_turn_on():
    assert plan.QUEUE_HELP.startswith("Default: on for files in a cluster, unless a lever (--steps_per_run, "
                                      "--local_steps, --accumulate_batches), --cache or backup workers "
                                      "(--replicas_to_aggregate) need the fixed shards")


TABLES = dict(has_tables=True, model="wide_deep")
STEP_PATHS = [
    (plan.StepSettings(distributed=True), plan.StepPath(plan.SINGLE)),
    (plan.StepSettings(sync=True, distributed=True), plan.StepPath(plan.SINGLE)),
    (plan.StepSettings(steps_per_run=8, steps_per_run_given=True, distributed=True),
     plan.StepPath(plan.STEPS_PER_RUN, 8)),
    (plan.StepSettings(local_steps=10, distributed=True), plan.StepPath(plan.LOCAL_STEPS, 10)),
    (plan.StepSettings(local_steps=10, distributed=True, **TABLES), plan.StepPath(plan.LOCAL_STEPS, 1)),
    (plan.StepSettings(local_steps=10, distributed=True, tables_take_rounds=True, **TABLES),
     plan.StepPath(plan.ROUNDS, 10, 10)),
    (plan.StepSettings(local_steps=10, distributed=False, tables_take_rounds=True, **TABLES),
     plan.StepPath(plan.LOCAL_STEPS, 1)),  # one process reads its tables as they are
    (plan.StepSettings(accumulate_batches=4, sync=True, distributed=True), plan.StepPath(plan.ACCUMULATE)),
]


@pytest.mark.parametrize("settings, expected", STEP_PATHS)
def test_the_step_path_of_each_lever_is_held_by_the_runs_config_and_picks_its_lever(settings, expected):
    path = plan.step_path(settings)
    assert path == expected
    train = TrainConfig(local_steps=settings.local_steps, accumulate_batches=settings.accumulate_batches,
                        sync_replicas=settings.sync, step_path=path)
    assert step.lever(train) is step.LEVERS[expected.name]


@pytest.mark.parametrize("settings, message", [
    (plan.StepSettings(local_steps=10, steps_per_run=5, steps_per_run_given=True, **TABLES),
     "--steps_per_run=5 with --local_steps=10 and --model=wide_deep: its tables' rows are read a step at a time"),
    (plan.StepSettings(local_steps=10, steps_per_run=5, steps_per_run_given=True),
     "--steps_per_run=5 with --local_steps=10: a session.run is one round of --local_steps steps"),
    (plan.StepSettings(local_steps=10, steps_per_run=10, steps_per_run_given=True, tables_take_rounds=True,
                       distributed=False, **TABLES),
     "--steps_per_run=10 with --local_steps=10 and --model=wide_deep in one process"),
])
def test_steps_per_run_beside_local_steps_is_refused_where_a_run_is_not_its_round(settings, message):
    with pytest.raises(plan.Conflict, match=message):
        plan.step_path(settings)
    # The one-process refusal waits for the cluster: the flags alone do not know it.
    if settings.distributed is False:
        assert plan.step_path(dataclasses.replace(settings, distributed=None)).name == plan.LOCAL_STEPS
