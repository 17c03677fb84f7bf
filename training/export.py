"""Export: the trained model as a SavedModel that serves raw features.

The chief writes <model_dir>/export/<global step> once training is over, from a graph rebuilt
without any device placement (so it loads anywhere, with no cluster), holding only the model:
features in, probabilities and classes out. It is written under a temporary name and renamed
when complete, so a reader never finds half an export. On SageMaker the chief also copies it into
SM_MODEL_DIR/<global step>, the layout SageMaker's TensorFlow Serving container deploys.
"""

import os

import tensorflow as tf
from absl import logging

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import spec
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.training import checkpoints

v1 = tf.compat.v1
SIGNATURE = "serving_default"


def serving_graph(cfg):
    """(graph, raw feature placeholders, outputs, the model's GraphTables) of the model alone, on no particular
    device."""
    data_spec = inputs.spec(cfg.data)
    graph = tf.Graph()
    with graph.as_default():
        features = {name: v1.placeholder(s.dtype, [None, *s.shape], name=name)
                    for name, s in data_spec.features.items()}
        graph_tables = GraphTables()
        logits = model.logits_of(features, cfg.model, data_spec, graph_tables)
        outputs = {
            "probabilities": tf.nn.softmax(logits, name="probabilities"),
            "classes": tf.argmax(logits, axis=1, name="classes"),
            "logits": logits,
        }
    return graph, features, outputs, graph_tables


def predict(cfg, checkpoint: str, features: dict) -> dict:
    """The outputs of `checkpoint` for a batch of raw features (numpy), in this process."""
    graph, placeholders, outputs, graph_tables = serving_graph(cfg)
    with graph.as_default(), v1.Session(graph=graph, config=spec.graph_rewrites()) as sess:
        checkpoints.restore_with_deltas(sess, v1.train.Saver().restore,
                                        checkpoints.delta_restorer(graph_tables, checkpoint), checkpoint)
        return sess.run(outputs, {placeholders[name]: value for name, value in features.items()})


def export(cfg, checkpoint: str) -> str:
    """Writes <model_dir>/export/<step of checkpoint> from `checkpoint`; returns its path."""
    step = int(tf.train.load_checkpoint(checkpoint).get_tensor("global_step"))
    export_dir = layout.export_dir(cfg.train.model_dir, step)
    partial = export_dir + ".incomplete"
    if tf.io.gfile.exists(partial):
        tf.io.gfile.rmtree(partial)
    graph, features, outputs, graph_tables = serving_graph(cfg)
    with graph.as_default(), v1.Session(graph=graph, config=spec.graph_rewrites()) as sess:
        checkpoints.restore_with_deltas(sess, v1.train.Saver().restore,
                                        checkpoints.delta_restorer(graph_tables, checkpoint), checkpoint)
        builder = v1.saved_model.Builder(partial)
        signature = v1.saved_model.predict_signature_def(inputs=features, outputs=outputs)
        builder.add_meta_graph_and_variables(sess, [v1.saved_model.tag_constants.SERVING],
                                             signature_def_map={SIGNATURE: signature})
        builder.save()
    if tf.io.gfile.exists(export_dir):
        tf.io.gfile.rmtree(export_dir)
    tf.io.gfile.rename(partial, export_dir)
    logging.info("exported the model at step %d to %s (signature %r: %s -> probabilities, classes)", step,
                 export_dir, SIGNATURE, ", ".join(sorted(features)))
    if cfg.train.export_copy_dir:
        copy = _copy_tree(export_dir, os.path.join(cfg.train.export_copy_dir, str(step)))
        logging.info("copied the export to %s (SM_MODEL_DIR: SageMaker packages it as the job's model)", copy)
    return export_dir


def _copy_tree(source: str, target: str) -> str:
    """Copies a directory under a temporary name, renamed when complete; returns target."""
    partial = target + ".incomplete"
    for path in (partial, target):
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
    for directory, _, files in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        tf.io.gfile.makedirs(os.path.join(partial, relative))
        for name in files:
            tf.io.gfile.copy(os.path.join(directory, name), os.path.join(partial, relative, name))
    tf.io.gfile.rename(partial, target)
    return target
