"""TF1's exporters, which train_and_evaluate runs after each evaluation (EvalSpec(exporters=...)): each
writes SavedModels under <model_dir>/export/<name>/ with Estimator.export_saved_model."""

import glob
import os

import tensorflow as tf
from tensorflow.python.platform import tf_logging as logging  # tf.compat.v1.logging: where a program looks

v1 = tf.compat.v1


class Exporter:
    """export(estimator, export_path, checkpoint_path, eval_result, is_the_final_export) -> the export's
    directory (bytes), or None when it writes none."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        if not name or not isinstance(name, str):
            raise ValueError(f"an exporter's name must be a non-empty string, not {name!r}")
        if serving_input_receiver_fn is None:
            raise ValueError(f"exporter {name}: serving_input_receiver_fn must be defined")
        self._name, self._receiver_fn = name, serving_input_receiver_fn
        self._assets_extra, self._as_text = assets_extra, as_text

    @property
    def name(self) -> str:
        return self._name

    def _save(self, estimator, export_path, checkpoint_path):
        return estimator.export_saved_model(export_path, self._receiver_fn, assets_extra=self._assets_extra,
                                            as_text=self._as_text, checkpoint_path=checkpoint_path)

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        raise NotImplementedError


def _keep_newest(export_path: str, keep: int | None) -> None:
    """Removes all but the `keep` newest timestamped exports under export_path."""
    if not keep:
        return
    exports = sorted(path for path in tf.io.gfile.glob(os.path.join(export_path, "*"))
                     if os.path.basename(path).isdigit())
    for old in exports[:-keep]:
        tf.io.gfile.rmtree(old)


class FinalExporter(Exporter):
    """Exports once, after the final evaluation (the checkpoint at max_steps)."""

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        del eval_result
        if not is_the_final_export:
            return None
        return self._save(estimator, export_path, checkpoint_path)


class LatestExporter(Exporter):
    """Exports after every evaluation, keeping the newest `exports_to_keep` (None: all)."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False, exports_to_keep=5):
        super().__init__(name, serving_input_receiver_fn, assets_extra, as_text)
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError(f"LatestExporter: exports_to_keep must be positive or None, not {exports_to_keep}")
        self._keep = exports_to_keep

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        del eval_result, is_the_final_export
        exported = self._save(estimator, export_path, checkpoint_path)
        _keep_newest(export_path, self._keep)
        return exported


def _loss_smaller(best_eval_result, current_eval_result) -> bool:
    if "loss" not in best_eval_result or "loss" not in current_eval_result:
        raise ValueError("BestExporter's default compare_fn needs 'loss' in the evaluation results")
    return best_eval_result["loss"] > current_eval_result["loss"]


class BestExporter(Exporter):
    """Exports when an evaluation is better than the best so far (compare_fn(best, current); by default
    a smaller loss). The best so far starts from the evaluations already in model_dir's event files
    (event_file_pattern) of earlier checkpoints, so a restarted evaluator does not export a worse model."""

    def __init__(self, name="best_exporter", serving_input_receiver_fn=None, event_file_pattern="eval/*.tfevents.*",
                 compare_fn=_loss_smaller, assets_extra=None, as_text=False, exports_to_keep=5):
        super().__init__(name, serving_input_receiver_fn, assets_extra, as_text)
        if not callable(compare_fn):
            raise ValueError("BestExporter: compare_fn must be callable")
        self._compare, self._pattern, self._keep = compare_fn, event_file_pattern, exports_to_keep
        self._best = None
        self._model_dir = None

    def _best_in_events(self, model_dir, before_step):
        """The best evaluation in the event files, of checkpoints before `before_step` (the one being
        exported is written there already)."""
        best = None
        for path in sorted(glob.glob(os.path.join(model_dir, self._pattern))):
            for event in v1.train.summary_iterator(path):
                if event.step >= before_step:
                    continue
                values = {value.tag: value.simple_value for value in event.summary.value}
                if values and (best is None or self._compare(best, values)):
                    best = values
        return best

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        del is_the_final_export
        if self._model_dir != estimator.model_dir:
            self._model_dir = estimator.model_dir
            self._best = self._best_in_events(estimator.model_dir, eval_result.get("global_step", 2**62))
        if self._best is not None and not self._compare(self._best, eval_result):
            logging.info("BestExporter %s: %s is not better than the best so far", self.name, checkpoint_path)
            return None
        self._best = eval_result
        exported = self._save(estimator, export_path, checkpoint_path)
        _keep_newest(export_path, self._keep)
        return exported
