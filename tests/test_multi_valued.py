"""Multi-valued categorical columns (model/multi_valued.py, --multi_valued_columns): read whole from CSV,
TFRecord lists and the Zipf generator, split in the model, a row per value, combined per example; rounds of
rows train them as plain steps do."""

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.input import tfrecord
from ps_trainer.model import multi_valued, tables
from ps_trainer.model.graph_tables import GraphTables
from tests.support import in_process_cluster, read_flags, tf_session, train_one_worker, trained_runs, write_records
from tests.test_flags import WORKER, usage_error

v1 = tf.compat.v1

FIELDS = [b"a|b", b"", b"b|c|c", b"||a", b"d", b"|"]
CITIES = [b"x", b"y", b"x", b"z", b"y", b"x"]


def combine(rows: list, combiner: str) -> np.ndarray:
    """numpy: an example's rows combined as --combiner says; no rows, zeros."""
    if not rows:
        return np.zeros(3, np.float32)
    total = np.sum(rows, axis=0)
    return {"sum": total, "mean": total / len(rows), "sqrtn": total / np.sqrt(len(rows))}[combiner]


@pytest.mark.pure
def test_multi_valued_columns_read_with_their_separators_and_bad_ones_are_refused(tmp_path):
    data = read_flags(*WORKER, "--dataset=zipf_clicks", "--model=wide_deep", "--multi_valued_columns=history").data
    assert data.multi_valued_columns == ("history:|",) and inputs.spec(data).separators == {"history": "|"}
    assert inputs.spec(data).features["history"].dtype == tf.string  # the raw field, as a log holds it
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "train-0.csv").write_text("clicked,city,tags\n1,x,a;b\n")
    read = read_flags(*WORKER, "--dataset=csv", f"--data_dir={csv_dir}", "--label_column=clicked",
                      "--categorical_columns=city", "--multi_valued_columns=tags:;", "--model=wide_deep",
                      "--combiner=sqrtn")
    assert read.data.multi_valued_columns == ("tags:;",) and read.model.combiner == "sqrtn"
    assert inputs.spec(read.data).separators == {"tags": ";"}
    assert sorted(inputs.spec(read.data).features) == ["city", "tags"]
    zipf = [*WORKER, "--dataset=zipf_clicks", "--model=wide_deep"]
    assert usage_error(*zipf, "--multi_valued_columns=C1") == (
        "--multi_valued_columns=C1: --dataset=zipf_clicks has only history of them")
    assert usage_error(*WORKER, "--dataset=clicks", "--model=wide_deep", "--multi_valued_columns=user") == (
        "--multi_valued_columns=user: --dataset=clicks has none of them")
    assert usage_error(*zipf, "--multi_valued_columns=history,history:;") == (
        "--multi_valued_columns names 'history' twice: give each column once")
    assert "is not NAME or NAME:SEPARATOR" in usage_error(*zipf, "--multi_valued_columns=history:")
    assert usage_error(*zipf, "--combiner=sum") == (
        "--combiner combines the rows of a multi-valued column's values: there is none (--multi_valued_columns); "
        "drop the flag.")
    assert usage_error(*zipf, "--multi_valued_columns=history", "--group_column=history") == (
        "--group_column=history is multi-valued (--multi_valued_columns): a group is one value; name a "
        "single-valued column")
    assert "no column 'tag' in its header" in usage_error(
        *WORKER, "--dataset=csv", f"--data_dir={csv_dir}", "--label_column=clicked", "--multi_valued_columns=tag")


@pytest.mark.pure
def test_csv_and_tfrecord_lists_reach_the_model_as_the_raw_field_and_a_value_holding_the_separator_is_named(
        tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "train-0.csv").write_text('clicked,tags,city\n1,"a|b,c",x\n0,,y\n1,d,z\n')
    csv = inputs.DataConfig(name="csv", data_dir=str(tmp_path / "csv"), label_column="clicked",
                            categorical_columns=("city",), multi_valued_columns=("tags:|",))
    (features, labels), = inputs.batches(csv, inputs.Shard(0, 1), 3, repeat=False)
    read = dict(zip(features["city"].numpy(), features["tags"].numpy()))
    assert read == {b"x": b"a|b,c", b"y": b"", b"z": b"d"} and sorted(labels.numpy()) == [0, 1, 1]

    def example(tags, ids, label):
        feature = {"tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=tags)),
                   "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        return tf.train.Example(features=tf.train.Features(feature=feature))

    (tmp_path / "tfr").mkdir()
    write_records(tmp_path / "tfr" / "train-0.tfrecord", [example([b"a", b"b"], [1, 2, 3], 1), example([], [], 0)])
    records = inputs.DataConfig(name="tfrecord", data_dir=str(tmp_path / "tfr"),
                                multi_valued_columns=("tags:|", "ids:|"))
    (features, labels), = inputs.batches(records, inputs.Shard(0, 1), 2, repeat=False)
    by_label = {int(label): (tags, ids) for label, tags, ids in zip(labels.numpy(), features["tags"].numpy(),
                                                                    features["ids"].numpy())}
    assert by_label == {1: (b"a|b", b"1|2|3"), 0: (b"", b"")}
    # A value that holds the separator would be split into two by the model: the record is named.
    write_records(tmp_path / "tfr" / "train-1.tfrecord", [example([b"a|b"], [4], 1)])
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        list(inputs.batches(records, inputs.Shard(0, 1), 2, repeat=False))
    assert inputs.bad_record_message(str(err.value)) == (
        f"bad input record: {tmp_path}/tfr/train-1.tfrecord record 0: 'tags' holds a value with its separator "
        "'|' (--multi_valued_columns), which would split it: give another")
    # A field written from a CSV row becomes a list of its values (scripts/convert_to_tfrecord.py).
    written = tf.train.Example.FromString(tfrecord.example_proto({"tags": b"a||b"}, 1, inputs.DataSpec(
        {"tags": tf.TensorSpec([], tf.string)}, 2, {"tags": "|"})))
    assert list(written.features.feature["tags"].bytes_list.value) == [b"a", b"b"]


@pytest.mark.inprocess
@pytest.mark.parametrize("embedding", ["hashed", "dynamic"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_each_example_reads_a_row_per_value_combined_and_an_empty_field_reads_zeros(embedding, combiner):
    model_cfg = model.ModelConfig(name="wide_deep", hash_buckets=50, embedding_dim=3, embedding=embedding,
                                  embedding_capacity=40, combiner=combiner)
    with tf.Graph().as_default():
        features = multi_valued.split_columns({"city": tf.constant(CITIES), "tags": tf.constant(FIELDS)},
                                              {"tags": "|"})
        graph_tables = GraphTables()
        with v1.variable_scope("wide_deep"):
            deep, wide = tables.KINDS[embedding].columns(features, ["city", "tags"], model_cfg, 2, True,
                                                         v1.random_normal_initializer(seed=1), graph_tables)
        shards = graph_tables.of().trained_shards
        with tf_session() as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            got, got_wide = sess.run([deep, wide])
            variables = {v.op.name: value for v, value in zip(v1.global_variables(),
                                                               sess.run(v1.global_variables()))}
            if embedding == "dynamic":
                maps = {name: sess.run(shard.map.pairs()) for name, shard in shards}

    def row_of(column: str, value: bytes) -> np.ndarray:
        if embedding == "hashed":
            bucket = int(tf.strings.to_hash_bucket_fast(value, 50))
            return variables[f"wide_deep/{column}/embedding"][bucket]
        keys, rows = maps[f"wide_deep/{column}"]
        return variables[f"wide_deep/{column}/shard0/embedding"][int(rows[list(keys).index(value)])]

    assert got.shape == (len(FIELDS), 2, 3) and got_wide.shape == (len(FIELDS), 2, 2)
    for example, (city, field) in enumerate(zip(CITIES, FIELDS)):
        np.testing.assert_allclose(got[example, 0], row_of("city", city), rtol=1e-6)
        values = [value for value in field.split(b"|") if value]  # "b|c|c" is three values, "||a" one
        np.testing.assert_allclose(got[example, 1], combine([row_of("tags", v) for v in values], combiner),
                                   rtol=1e-5, atol=1e-7, err_msg=f"example {example}: {field!r}")
    assert not got[1, 1].any() and not got[5, 1].any()  # no value: zeros, not an error
    if embedding == "dynamic":  # a row per distinct value, the default row besides
        assert sorted(maps["wide_deep/tags"][0]) == [b"a", b"b", b"c", b"d"]


@pytest.mark.servers
def test_rounds_of_rows_train_a_multi_valued_column_as_plain_steps(tmp_path):
    # zipf_clicks' history: up to 50 values an example, many shared within a round's batches.
    data = inputs.DataConfig(name="zipf_clicks", synthetic_examples=500, multi_valued_columns=("history:|",))
    wide_deep = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                                  embedding_partitions=2, combiner="sqrtn")
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, _, _, _ = train_one_worker(tmp_path / "local", data, wide_deep, 5, 13, cluster=(cluster, servers[0].target),
                                     local_steps=5, optimizer="adagrad", rounds=True)
    train_one_worker(tmp_path / "plain", data, wide_deep, 1, 13, optimizer="adagrad")
    assert trained_runs(runs) == [(5, 5), (5, 10), (3, 13)]
    local, plain = (tf.train.load_checkpoint(str(tmp_path / run / "model.ckpt-13")) for run in ("local", "plain"))
    start = tf.train.load_checkpoint(str(tmp_path / "plain" / "model.ckpt-0"))
    for name in ("wide_deep/history/embedding", "wide_deep/history/embedding/Adagrad", "wide_deep/history/wide",
                 "wide_deep/C1/embedding", "wide_deep/hidden0/kernel"):
        np.testing.assert_allclose(local.get_tensor(name), plain.get_tensor(name), rtol=1e-4, atol=1e-6,
                                   err_msg=name)
    moved = np.any(plain.get_tensor("wide_deep/history/embedding") != start.get_tensor("wide_deep/history/embedding"),
                   axis=1)
    assert moved.sum() > 100  # the history's rows trained: the comparison above sees them
