"""The group AUC (training/gauc.py, --group_column): per-group AUCs weighted by their examples, groups of one
class skipped and counted, equal to a pairwise count; the held-out evaluation reports it for a real
checkpoint on a fixed file as a numpy computation over the same model's scores does."""

import csv

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from tests.support import train_one_worker, write_click_csvs
from ps_trainer.training import evaluator, export, gauc
from ps_trainer.training.config import RunConfig, TrainConfig
from ps_trainer.cluster import spec


def pairwise_gauc(groups, labels, scores):
    """GAUC from its definition: per group, the share of (positive, negative) pairs the positive wins (a
    tie half), weighted by the group's examples; groups of one class skipped."""
    total = weights = skipped = 0
    for group in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        positives = [scores[i] for i in members if labels[i] == 1]
        negatives = [scores[i] for i in members if labels[i] == 0]
        if not positives or not negatives:
            skipped += 1
            continue
        wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
        total += len(members) * wins / (len(positives) * len(negatives))
        weights += len(members)
    return total / weights, skipped


@pytest.mark.pure
def test_the_group_auc_is_the_example_weighted_mean_of_pairwise_aucs_with_one_class_groups_skipped():
    rng = np.random.RandomState(0)
    groups = rng.randint(0, 30, size=400).astype(str)
    labels = (rng.rand(400) < 0.3).astype(np.int64)
    scores = np.round(rng.rand(400) + 0.3 * labels, 1)  # rounded: many ties
    found = gauc.group_auc(groups, labels, scores)
    expected, skipped = pairwise_gauc(groups.tolist(), labels.tolist(), scores.tolist())
    assert found.value == pytest.approx(expected, abs=1e-12)
    assert (found.groups + found.skipped, found.skipped) == (30, skipped)
    two = gauc.group_auc(["a", "a", "b", "b", "b", "c"], [1, 0, 1, 0, 0, 1], [0.9, 0.1, 0.2, 0.5, 0.1, 0.3])
    assert two == gauc.GroupAuc((2 * 1.0 + 3 * 0.5) / 5, 2, 1)  # 'c' has one class
    empty = gauc.group_auc([], [], [])  # an empty held-out split
    assert np.isnan(empty.value) and (empty.groups, empty.skipped) == (0, 0)


@pytest.mark.inprocess
def test_the_held_out_evaluation_reports_the_group_auc_of_the_checkpoints_scores(tmp_path):
    write_click_csvs(tmp_path / "csv", rows=3000)
    data = inputs.DataConfig(name="csv", data_dir=str(tmp_path / "csv"), label_column="clicked",
                             numeric_columns=("price", "hour"), categorical_columns=("user", "city"),
                             group_column="user")
    model_cfg = model.ModelConfig(name="wide_deep", hash_buckets=1000, embedding_dim=4, hidden_units=(8,))
    train_one_worker(tmp_path / "model", data, model_cfg, steps_per_run=1, train_steps=40, optimizer="ftrl_adagrad")
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "model"))
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(model_dir=str(tmp_path / "model")), model_cfg, data)
    _, metrics = evaluator.evaluate(cfg, checkpoint)
    # The same checkpoint's scores of the same held-out rows, read here with the csv module.
    rows = [row for name in ("eval-0.csv", "eval-1.csv") for row in csv.DictReader(open(tmp_path / "csv" / name))]
    features = {"price": np.array([float(r["price"]) for r in rows], np.float32),
                "hour": np.array([float(r["hour"]) for r in rows], np.float32),
                "user": np.array([r["user"] for r in rows], object),
                "city": np.array([r["city"] for r in rows], object)}
    scores = export.predict(cfg, checkpoint, features)["probabilities"][:, 1]
    expected, skipped = pairwise_gauc([r["user"] for r in rows], [int(r["clicked"]) for r in rows], scores.tolist())
    assert metrics["gauc"] == pytest.approx(expected, abs=1e-6)
    assert metrics["gauc_skipped"] == skipped and metrics["gauc_groups"] + skipped == len({r["user"] for r in rows})
    assert 0.5 < metrics["gauc"] and "gauc " in evaluator.describe(metrics)
