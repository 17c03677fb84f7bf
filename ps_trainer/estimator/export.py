"""tf.estimator.export: what a serving_input_receiver_fn returns (a ServingInputReceiver, or a
TensorServingInputReceiver of one tensor), the two builders of one TF1 programs used, and TensorFlow's own
ExportOutput classes; `save` writes an Estimator's SavedModel."""

import collections
import os

import tensorflow as tf
from tensorflow.python.saved_model.model_utils import export_output, export_utils

from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.training import checkpoints

v1 = tf.compat.v1

ClassificationOutput = export_output.ClassificationOutput
EvalOutput = export_output.EvalOutput
ExportOutput = export_output.ExportOutput
PredictOutput = export_output.PredictOutput
RegressionOutput = export_output.RegressionOutput
TrainOutput = export_output.TrainOutput

__all__ = ["ClassificationOutput", "EvalOutput", "ExportOutput", "PredictOutput", "RegressionOutput",
           "ServingInputReceiver", "TensorServingInputReceiver", "TrainOutput",
           "build_parsing_serving_input_receiver_fn", "build_raw_serving_input_receiver_fn"]


def _as_dict(tensors, default_name):
    return dict(tensors) if isinstance(tensors, dict) else {default_name: tensors}


class ServingInputReceiver(collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """The features the model_fn gets at serving time, and the tensors a request feeds (a tensor or a
    dict of them; a single one is named 'feature' and 'input' as TF1 named them)."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("ServingInputReceiver: features must be defined")
        if receiver_tensors is None:
            raise ValueError("ServingInputReceiver: receiver_tensors must be defined")
        features = _as_dict(features, export_utils.SINGLE_FEATURE_DEFAULT_NAME)
        receiver_tensors = _as_dict(receiver_tensors, export_utils.SINGLE_RECEIVER_DEFAULT_NAME)
        alternatives = {name: _as_dict(tensors, export_utils.SINGLE_RECEIVER_DEFAULT_NAME)
                        for name, tensors in (receiver_tensors_alternatives or {}).items()}
        return super().__new__(cls, features, receiver_tensors, alternatives or None)


class TensorServingInputReceiver(collections.namedtuple(
        "TensorServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """A ServingInputReceiver whose features are one tensor (or SparseTensor), which the model_fn gets as it is,
    not in a dict, as TF1's did."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("TensorServingInputReceiver: features must be defined")
        if not isinstance(features, tf.Tensor | tf.SparseTensor):
            raise ValueError(f"TensorServingInputReceiver: features must be a Tensor or a SparseTensor, not "
                             f"{type(features).__name__}")
        receiver = ServingInputReceiver(features, receiver_tensors, receiver_tensors_alternatives)
        return super().__new__(cls, features, receiver.receiver_tensors, receiver.receiver_tensors_alternatives)


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A receiver fn that takes serialized tf.Examples ('examples') and parses them by feature_spec."""

    def serving_input_receiver_fn():
        serialized = v1.placeholder(tf.string, [default_batch_size], name="input_example_tensor")
        return ServingInputReceiver(v1.io.parse_example(serialized, feature_spec), {"examples": serialized})

    return serving_input_receiver_fn


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A receiver fn that takes each feature as it is: a placeholder of each tensor's dtype and shape
    (its batch dimension `default_batch_size`)."""

    def serving_input_receiver_fn():
        placeholders = {}
        for name, tensor in features.items():
            shape = [default_batch_size] + tensor.shape.as_list()[1:]
            placeholders[name] = v1.placeholder(tensor.dtype, shape, name=name)
        return ServingInputReceiver(placeholders, dict(placeholders))

    return serving_input_receiver_fn


def save(estimator, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
         checkpoint_path=None) -> bytes:
    """Writes the model_fn's PREDICT graph over the receiver's features, with the checkpoint's variables,
    as a SavedModel in a new timestamped directory under export_dir_base (written under a temporary
    name, then renamed: a reader never sees half of one); returns its path, as bytes (as TF1 did)."""
    checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
    if checkpoint_path is None:
        raise ValueError(f"Couldn't find trained model at {estimator.model_dir}.")
    export_dir = export_utils.get_timestamped_export_dir(export_dir_base)
    temporary = export_utils.get_temp_export_dir(export_dir).decode()
    with tf.Graph().as_default():
        estimator._seed()  # noqa: SLF001  (the Estimator's own graph-building steps, as train and evaluate use them)
        v1.train.get_or_create_global_step()
        receiver = serving_input_receiver_fn()
        graph_tables = GraphTables()
        model = estimator._call_model_fn(receiver.features, None, "infer", graph_tables)  # noqa: SLF001  (the Estimator's own graph-building steps, as train and evaluate use them)
        outputs = export_utils.export_outputs_for_mode("infer", serving_export_outputs=model.export_outputs or None,
                                                       predictions=model.predictions)
        signatures = export_utils.build_all_signature_defs(receiver.receiver_tensors, outputs,
                                                           receiver.receiver_tensors_alternatives, serving_only=True)
        saver = checkpoints.saver_for_restore(model.scaffold)
        # The delta checkpoints written after checkpoint_path (the dynamic tables' changed rows), if any.
        deltas = checkpoints.delta_restorer(graph_tables, checkpoint_path)
        local_init_op = (model.scaffold and model.scaffold.local_init_op) or v1.train.Scaffold.default_local_init_op()
        with v1.Session(config=estimator.config.session_config) as session:
            checkpoints.restore_with_deltas(session, saver.restore, deltas, checkpoint_path)
            builder = v1.saved_model.Builder(temporary)
            builder.add_meta_graph_and_variables(
                session, [tf.saved_model.SERVING], signature_def_map=signatures,
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=local_init_op, strip_default_attrs=True, saver=saver)
            builder.save(as_text)
    for name, source in (assets_extra or {}).items():
        destination = os.path.join(temporary, "assets.extra", name)
        tf.io.gfile.makedirs(os.path.dirname(destination))
        tf.io.gfile.copy(source, destination)
    tf.io.gfile.rename(temporary, export_dir.decode())
    return export_dir
