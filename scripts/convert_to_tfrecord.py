#!/usr/bin/env python3
"""Writes any dataset the trainer reads into the TFRecord format that --dataset=tfrecord reads.

    python scripts/convert_to_tfrecord.py --dataset=idx --data_dir=/data/mnist --output_dir=/data/mnist-tfr
    python scripts/convert_to_tfrecord.py --dataset=csv --data_dir=/data/clicks --output_dir=/data/clicks-tfr \\
        --label_column=clicked --numeric_columns=price,hour --categorical_columns=user,item
    python scripts/convert_to_tfrecord.py --dataset=synthetic --synthetic_examples=20000 --output_dir=/data/synthetic

Reads both splits with the trainer's own readers and flags (so the same records come out, and a bad
one is reported the same way) and writes train-NNNNN-of-NNNNN.tfrecord and eval-... files of
tf.train.Example. The embedded datasets (synthetic images: 'image' as raw uint8 28x28x1 bytes and
'label' as int64; clicks) come out by --seed and --synthetic_examples, so a TFRecord run can be
compared with an embedded one. Train the result with the same column flags and --dataset=tfrecord
--data_dir=<output_dir>.
"""

from absl import app, flags

from ps_trainer import input as inputs
from ps_trainer.cluster import spec
from ps_trainer.flags import config as flag_config
from ps_trainer.flags import definitions
from ps_trainer.input import tfrecord

flags.DEFINE_string("output_dir", None, "Directory to write the TFRecord files into.", required=True)
flags.DEFINE_integer("num_files", 4, "Files per split; use at least as many as workers.", lower_bound=1)
FLAGS = flags.FLAGS
definitions.define(FLAGS)  # the trainer's data flags


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected argument(s) {' '.join(argv[1:])}")
    if FLAGS.dataset == "tfrecord":
        raise app.UsageError("--dataset=tfrecord: the data is TFRecord already")
    cfg = flag_config.read_data(FLAGS, spec.ClusterConfig(), {})
    data_spec = inputs.spec(cfg)
    for split in ("train", "eval"):
        try:
            records = inputs.DATASETS[cfg.name].records(cfg, split, inputs.Shard(0, 1))
        except (FileNotFoundError, ValueError) as err:
            print(f"{split}: skipped ({err})")
            continue
        examples = (({name: value.numpy() for name, value in features.items()}, int(label))
                    for features, label in records)
        paths = tfrecord.write(examples, data_spec, FLAGS.output_dir, split, FLAGS.num_files, cfg.label_column)
        print(f"{split}: wrote {len(paths)} files to {FLAGS.output_dir}")


if __name__ == "__main__":
    app.run(main)
