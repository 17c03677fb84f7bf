"""Each input format trains end to end: CSV (wide_deep, a multi-valued column) and MNIST IDX (mlp) in a real cluster and
Criteo's click logs in one process here, TFRecord in test_e2e.py; CSV converted to TFRecord reads
back the same rows. Shards are checked disjoint in test_input.py."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer.input import idx
from ps_trainer.training import exit_codes, export
from tests.support import (describe, finished, read_flags, run_script, run_trainer, serve_in_fresh_process,
                           write_click_csvs, write_criteo_files)

pytestmark = pytest.mark.e2e
COLUMNS = ["--label_column=clicked", "--numeric_columns=price,hour", "--categorical_columns=user,city"]


def run_cluster(make_cluster, *args):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=["--train_steps=240", *args])
    cluster.start_all()
    codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe(cluster)
    for worker in (0, 1):
        assert int(finished(cluster.log("worker", worker))["local_steps"]) > 0
    return cluster


def test_csv_with_a_multi_valued_column_trains_wide_deep_and_the_export_serves_its_raw_field(make_cluster, tmp_path):
    write_click_csvs(tmp_path / "csv")
    cluster = run_cluster(make_cluster, "--dataset=csv", f"--data_dir={tmp_path / 'csv'}", "--model=wide_deep",
                          *COLUMNS, "--multi_valued_columns=recent", "--embedding=dynamic")
    # Judged on the held-out rows (the chief's evaluation of the final checkpoint), never one batch:
    # a coin flip's loss is log 2 = 0.69; the city alone gives 0.9 accuracy.
    result = finished(cluster.log("worker", 0))
    assert float(result["heldout_loss"]) < 0.6 and float(result["heldout_accuracy"]) > 0.75, result
    # The export, in a fresh process, scores raw rows as the final checkpoint does, whatever their history:
    # empty, of separators only, short, long, of items training never met.
    cfg = read_flags(*cluster.trainer_args)
    final = tf.train.latest_checkpoint(str(cluster.model_dir))
    rows = [b"", b"|", b"i3", b"i25|i40", b"|".join(b"i%d" % i for i in range(50)), b"never|met|i7"]
    features = {"user": np.array([b"u1"] * len(rows), object), "city": np.array([b"c3"] * len(rows), object),
                "price": np.full(len(rows), 20.0, np.float32), "hour": np.full(len(rows), 8.0, np.float32),
                "recent": np.array(rows, object)}
    expected = export.predict(cfg, final, features)
    step = int(tf.train.load_checkpoint(final).get_tensor("global_step"))
    served = serve_in_fresh_process(cluster.model_dir / "export" / str(step), features)
    np.testing.assert_allclose(served["probabilities"], expected["probabilities"], rtol=1e-5, atol=1e-6)
    scores = np.array(expected["probabilities"])[:, 1]
    assert scores[0] == scores[1] and len(set(scores[1:].round(6))) == len(rows) - 1, scores  # the history counts
    # Read through the input queue (the default for files in a cluster); a worker that ends at
    # --train_steps gives its files back, so that no peer waits out a lease for its last steps.
    for worker in (0, 1):
        log = cluster.log("worker", worker)
        assert "handed out by the input queue on ps 0" in log and "silent for more than" not in log, describe(cluster)


def test_criteo_logs_as_they_come_train_wide_deep(tmp_path):
    # Gzipped, as Criteo publishes its days.
    data_dir = tmp_path / "criteo"
    write_criteo_files(data_dir)
    for split in ("train", "eval"):
        (data_dir / f"{split}.txt.gz").write_bytes(gzip.compress((data_dir / f"{split}.txt").read_bytes()))
        (data_dir / f"{split}.txt").unlink()
    args = ["--dataset=criteo", f"--data_dir={data_dir}", "--model=wide_deep", "--export_saved_model=false"]
    result = run_trainer(*args, "--train_steps=300", f"--model_dir={tmp_path / 'model'}")
    assert result.returncode == 0, result.stderr[-3000:]
    # Held out: the first id alone gives 0.85 accuracy; a coin flip 0.5.
    figures = finished(result.stderr)
    assert float(figures["heldout_accuracy"]) > 0.75 and float(figures["heldout_auc"]) > 0.8, figures
    # A day whose compressed data is damaged stops training on one line, exit 1: it ended in a traceback.
    damaged = bytearray((data_dir / "train.txt.gz").read_bytes())
    damaged[12:40] = bytes(byte ^ 0x55 for byte in damaged[12:40])  # the first block's code tables
    (data_dir / "train.txt.gz").write_bytes(bytes(damaged))
    result = run_trainer(*args, "--train_steps=300", f"--model_dir={tmp_path / 'model-2'}")
    assert result.returncode == exit_codes.BAD_DATA.code and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "(an input file is corrupt: a gzipped one whose data is damaged" in result.stderr.splitlines()[-1]


def test_mnist_replicas_own_command_line_trains_on_idx_files(make_cluster, tmp_path):
    # Learnable IDX data: the embedded dataset written out as MNIST ships it (gzipped).
    from ps_trainer import input as inputs
    cfg = inputs.DataConfig(synthetic_examples=2000)
    for split in ("train", "eval"):
        pairs = [(f["image"].numpy()[..., 0], int(label))
                 for f, label in inputs.synthetic.records(cfg, split, inputs.Shard(0, 1))]
        idx.write(np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs]), str(tmp_path / "mnist"),
                  split, compress=True)
    # mnist_replica's flags as its own test script passes them; the format is found from the files.
    cluster = run_cluster(make_cluster, "--num_gpus=0", "--existing_servers=False", "--hidden_units=100",
                          "--sync_replicas=True", "--replicas_to_aggregate=2", f"--data_dir={tmp_path / 'mnist'}")
    chief = cluster.log("worker", 0)
    assert "reading dataset idx" in chief and "the defaults for 2 sync worker(s)" in chief
    assert float(finished(chief)["heldout_accuracy"]) > 0.3  # chance: 0.1


def test_csv_converted_to_tfrecord_reads_back_the_same_rows(tmp_path):
    from ps_trainer import input as inputs
    write_click_csvs(tmp_path / "csv", rows=200)
    result = run_script("convert_to_tfrecord.py", "--dataset=csv", f"--data_dir={tmp_path / 'csv'}",
                        f"--output_dir={tmp_path / 'tfr'}", "--num_files=2", *COLUMNS, "--multi_valued_columns=recent",
                        timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train: wrote 2 files" in result.stdout and "eval: wrote 2 files" in result.stdout
    columns = dict(label_column="clicked", numeric_columns=("price", "hour"), categorical_columns=("user", "city"),
                   multi_valued_columns=("recent:|",))

    def rows(name, data_dir, split):
        cfg = inputs.DataConfig(name=name, data_dir=str(data_dir), **columns)
        return sorted((round(float(f["price"]), 3), float(f["hour"]), f["user"].numpy(), f["city"].numpy(),
                       f["recent"].numpy(), int(y))
                      for f, y in inputs.DATASETS[name].records(cfg, split, inputs.Shard(0, 1)))

    for split in ("train", "eval"):
        assert rows("tfrecord", tmp_path / "tfr", split) == rows("csv", tmp_path / "csv", split)
