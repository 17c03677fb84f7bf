"""The kinds of embedding table a model's categorical columns can have (--embedding), each a module of its
own with what TableKind names: how a column's rows are looked up, which flags only it takes, how a checkpoint
of it restores and what a resume keeps of it. The trainer asks the kind; it never names one."""

from typing import Protocol

import tensorflow as tf

from model import dynamic, hashed


class TableKind(Protocol):
    OWN_FLAGS: tuple[str, ...]  # the settings only this kind has

    def misplaced(self, flag: str, embedding: str) -> str:
        """The refusal of one of OWN_FLAGS given for another kind, --embedding=`embedding`."""

    def columns(self, features, names, model_cfg, num_classes: int, training: bool,
                initializer) -> tuple[tf.Tensor, ...]:
        """(embeddings [batch, columns, model_cfg.embedding_dim], wide weights [batch, columns, num_classes]) of
        the categorical columns `names` (`training`: a kind may add rows as it meets IDs)."""

    def restore_refusal(self, saved: dict, now) -> str | None:
        """Why a checkpoint of this kind (`saved`: its run's model settings, run.json's) cannot restore into
        tables of `now` (model.ModelConfig), or None."""

    def resumed_pieces(self, saved: dict) -> int | None:
        """The pieces a resume keeps from the checkpoint's run unless --embedding_partitions is given, or
        None for this run's own cut."""


KINDS: dict[str, TableKind] = {"hashed": hashed, "dynamic": dynamic}
