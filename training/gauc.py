"""Group AUC (GAUC): the impression-weighted mean of per-group AUCs, the figure ranking teams judge a
model by (a group is a user, a query, a page: --group_column). A group whose examples are all of one
class has no AUC: it is skipped and counted."""

from typing import NamedTuple

import numpy as np


class GroupAuc(NamedTuple):
    value: float  # NaN when no group has both classes
    groups: int  # groups with both classes, in the mean
    skipped: int  # groups of one class


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """AUC by ranks (ties share their mean rank): the chance a positive scores above a negative."""
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    # Mean rank of each run of equal scores (1-based).
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2
    positives = labels.sum()
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def group_auc(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> GroupAuc:
    """GAUC of binary `labels` (0/1) and `scores`, example by example, grouped by `groups`."""
    labels = np.asarray(labels).astype(np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if not labels.size:
        return GroupAuc(float("nan"), 0, 0)
    _, group_ids = np.unique(np.asarray(groups).ravel(), return_inverse=True)
    order = np.argsort(group_ids, kind="stable")
    bounds = np.flatnonzero(np.r_[True, group_ids[order][1:] != group_ids[order][:-1], True])
    total, weights, used, skipped = 0.0, 0, 0, 0
    for start, end in zip(bounds[:-1], bounds[1:]):
        members = order[start:end]
        positives = labels[members].sum()
        if positives in (0, len(members)):
            skipped += 1
            continue
        total += len(members) * _auc(labels[members], scores[members])
        weights += len(members)
        used += 1
    return GroupAuc(total / weights if weights else float("nan"), used, skipped)
