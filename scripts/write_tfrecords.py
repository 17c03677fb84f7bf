#!/usr/bin/env python3
"""Writes a dataset into the TFRecord format that --dataset=tfrecord reads.

    python scripts/write_tfrecords.py --output_dir=/data/synthetic --num_files=8

Writes train-NNNNN-of-NNNNN.tfrecord and eval-... files of tf.train.Example ('image': raw uint8
28x28x1 bytes, 'label': int64). The source is the embedded synthetic dataset (by --seed and
--synthetic_examples), so a TFRecord run can be compared with a synthetic one.
"""

from absl import app, flags, logging

import input as inputs
from input import tfrecord

flags.DEFINE_string("output_dir", None, "Directory to write the files into.", required=True)
flags.DEFINE_integer("num_files", 4, "Files per split; use at least as many as workers.", lower_bound=1)
flags.DEFINE_integer("synthetic_examples", 20000, "Training examples to write.", lower_bound=1)
flags.DEFINE_integer("seed", 42, "Seed of the synthetic dataset.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected argument(s) {' '.join(argv[1:])}")
    cfg = inputs.DataConfig(synthetic_examples=FLAGS.synthetic_examples, seed=FLAGS.seed)
    whole = inputs.Shard(0, 1)
    for split in ("train", "eval"):
        records = (({"image": features["image"].numpy()}, label.numpy()) for features, label in
                   inputs.synthetic.records(cfg, split, whole))
        paths = tfrecord.write(records, inputs.synthetic.spec(cfg), FLAGS.output_dir, split, FLAGS.num_files)
        logging.info("wrote %d %s files to %s", len(paths), split, FLAGS.output_dir)


if __name__ == "__main__":
    app.run(main)
