"""The trainer's own feature column for a model_fn: `dynamic_embedding_column(key, dimension)`, an embedding
row of its own for each raw value of a feature, in the trainer's dynamic tables (model/dynamic/column.py).
It trains under `trainer.py --model_fn=FILE.py:FUNCTION --embedding=dynamic` (docs/estimator.md)."""

from ps_trainer.model.dynamic.column import dynamic_embedding_column

__all__ = ["dynamic_embedding_column"]
