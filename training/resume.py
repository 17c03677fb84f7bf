"""What the chief checks in --model_dir before it trains: each refusal is one line and a permanent exit,
raised before anything in model_dir is removed, restored or rewritten.

In the order _train meets them:
- check_training_files (--input_queue): the checkpoint's epochs are of the files the run recorded;
- check_final_checkpoint (a chief restarted after the end): its done mark has its final checkpoint;
- check_and_record (once the ps tasks are up): the newest checkpoint restores into this run's model (the
  dynamic tables' layout, the input queue's file count, every variable's shape); then the saves that
  never completed are removed and run.json is written for the evaluator and the other workers.
"""

import os

import tensorflow as tf
from absl import logging

from ps_trainer import input as inputs
from ps_trainer.cluster import model_dir as layout
from ps_trainer.input import work_queue
from ps_trainer.training import checkpoints, exit_codes, run_record

v1 = tf.compat.v1


def check_training_files(cfg) -> None:
    """Refuses a resume over other training files than the run recorded; records them otherwise."""
    files = work_queue.files_of(inputs.DATASETS[cfg.data.name].files(cfg.data, "train"))
    model_dir = cfg.train.model_dir
    refusal = work_queue.files_refusal(layout.queue_files(model_dir), files,
                                       tf.train.latest_checkpoint(model_dir) is not None, cfg.data.data_dir)
    if refusal:
        raise exit_codes.Failure(f"{cfg.cluster.task_name}: {refusal}", exit_codes.BAD_FLAGS)
    work_queue.record_files(layout.queue_files(model_dir), files)


def check_final_checkpoint(model_dir: str, last_step: int, task_name: str) -> None:
    """A done mark whose final checkpoint is gone (removed by hand or by a retention policy) stops the
    chief: it can neither export what was trained nor train again while the mark says training is over
    (the ps tasks read it too). Restarting would not help, so it is permanent, not the transient
    'final checkpoint not saved' it would otherwise end on."""
    newest = tf.train.latest_checkpoint(model_dir)
    if (checkpoints.checkpoint_step(newest) or 0) >= last_step:
        return
    raise exit_codes.Failure(
        f"{task_name}: {layout.done_mark(model_dir, 0)} says training finished at global step {last_step}, but no "
        f"checkpoint of that step is in {model_dir} (the newest: {os.path.basename(newest) if newest else 'none'}): "
        "the trained model is gone. To train again from the newest checkpoint, remove that mark with the rest of "
        f"{layout.done_dir(model_dir)}; or give the run a new --model_dir",
        exit_codes.TRAINED_MODEL_GONE)


def check_and_record(cfg, input_queue) -> None:
    """Removes the saves that never completed, refuses a checkpoint this run's model cannot resume
    (BAD_FLAGS), logs a recut of the tables, and writes run.json. `input_queue`: the graph's, or None."""
    model_dir, task_name = cfg.train.model_dir, cfg.cluster.task_name
    checkpoints.remove_interrupted_saves(model_dir, task_name)
    latest = tf.train.latest_checkpoint(model_dir)
    record = run_record.read(model_dir) if latest else None
    refusal = run_record.layout_refusal(record, cfg) or (input_queue and work_queue.resume_refusal(
        latest, input_queue.feed.queue.num_files, cfg.data.data_dir))
    shapes = not refusal and checkpoints.shape_refusal(latest, v1.global_variables())
    if shapes:
        said = run_record.shape_flags(record, cfg)
        refusal = shapes + (f" (its run.json says {' '.join(said)})" if said else "")
    if refusal:
        raise exit_codes.Failure(f"{task_name}: {refusal}", exit_codes.BAD_FLAGS)
    recut = run_record.layout_change(record, cfg)
    if recut:
        logging.warning("%s: %s", task_name, recut)
    run_record.write(cfg)
