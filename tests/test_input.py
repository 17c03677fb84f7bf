"""Inputs: the embedded dataset is deterministic and learnable, and shards never overlap."""

import dataclasses
import gzip
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer.input import packing, synthetic, tfrecord, work_queue, zipf_clicks
from tests.support import write_records

pytestmark = pytest.mark.pure

CFG = inputs.DataConfig(synthetic_examples=120, seed=7)


def epoch(cfg, shard, split="train"):
    """One pass over a shard's records, as (image bytes, label) pairs, in eager mode."""
    dataset = inputs.DATASETS[cfg.name].records(cfg, split, shard)
    return [(features["image"].numpy().tobytes(), int(label)) for features, label in dataset]


def test_synthetic_is_a_pure_function_of_the_seed():
    assert epoch(CFG, inputs.Shard(0, 1)) == epoch(CFG, inputs.Shard(0, 1))
    other_seed = inputs.DataConfig(synthetic_examples=120, seed=8)
    assert epoch(CFG, inputs.Shard(0, 1)) != epoch(other_seed, inputs.Shard(0, 1))


def test_synthetic_images_have_the_declared_shape_and_every_class():
    features, labels = zip(*inputs.DATASETS["synthetic"].records(CFG, "train", inputs.Shard(0, 1)))
    images = [f["image"] for f in features]
    assert images[0].shape == (28, 28, 1) and images[0].dtype == tf.uint8
    assert set(int(label) for label in labels) == set(range(10))


def test_synthetic_classes_are_separable_by_their_prototypes():
    # Nearest prototype, blind to the shifts, already beats chance (0.1) threefold.
    templates = synthetic.prototypes(CFG.seed).reshape(10, -1)
    records = epoch(inputs.DataConfig(synthetic_examples=500, seed=CFG.seed), inputs.Shard(0, 1))
    hits = 0
    for image, label in records:
        pixels = np.frombuffer(image, np.uint8).astype(np.float32) / 255.0
        hits += int(np.argmax(templates @ pixels) == label)
    assert hits / len(records) > 0.3


def test_synthetic_shards_are_disjoint_and_cover_the_epoch():
    whole = epoch(CFG, inputs.Shard(0, 1))
    for count in (2, 3):
        shards = [epoch(CFG, inputs.Shard(i, count)) for i in range(count)]
        seen = [image for shard in shards for image, _ in shard]
        assert len(seen) == len(set(seen)) == len(whole), count
        assert sorted(seen) == sorted(image for image, _ in whole), count


def test_eval_split_is_held_out():
    train = {image for image, _ in epoch(CFG, inputs.Shard(0, 1))}
    held_out = {image for image, _ in epoch(CFG, inputs.Shard(0, 1), split="eval")}
    assert len(held_out) == synthetic.EVAL_EXAMPLES and not train & held_out


@pytest.fixture
def tfrecord_dir(tmp_path):
    records = [({"image": f["image"].numpy()}, label.numpy()) for f, label in
               synthetic.records(CFG, "train", inputs.Shard(0, 1))]
    tfrecord.write(records, synthetic.spec(CFG), str(tmp_path), "train", num_files=3)
    return tmp_path


def test_tfrecord_files_keep_images_and_labels_and_shards_are_disjoint_and_complete(tfrecord_dir):
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir))
    assert tfrecord.check(cfg) is None and not list(tfrecord_dir.glob("*.incomplete"))
    written = sorted(epoch(CFG, inputs.Shard(0, 1)))
    for workers in (1, 2, 4):  # 3 files: 2 workers read by file, 4 by record
        shards = [epoch(cfg, inputs.Shard(i, workers)) for i in range(workers)]
        assert all(shards), workers
        assert sorted(record for shard in shards for record in shard) == written, workers


def test_batches_are_raw_features_and_full():
    features, labels = next(iter(inputs.batches(CFG, inputs.Shard(1, 2), batch_size=16)))
    assert features["image"].shape == (16, 28, 28, 1) and features["image"].dtype == tf.uint8
    assert labels.shape == (16,)


@pytest.mark.parametrize("in_blocks", [True, False], ids=["blocks", "records"])
def test_batches_of_packed_examples_are_the_batches_of_the_examples_as_they_come(in_blocks):
    # zipf_clicks: 26 string and 13 float features and a label, 40 components an example; packed, 3.
    cfg = inputs.DataConfig(name="zipf_clicks", synthetic_examples=500, seed=3, shuffle_buffer=100)
    shard = inputs.Shard(1, 2)
    records = zipf_clicks.records(cfg, "train", shard)
    examples = zipf_clicks.blocks(cfg, "train", shard) if in_blocks else records
    given = []

    def shuffled_batches(packed):
        given.append(packed.element_spec)
        return packed.cache().shuffle(cfg.shuffle_buffer, seed=cfg.seed + shard.index).batch(32)

    batches = list(packing.batched(examples, shuffled_batches, in_blocks))
    assert [spec.shape.as_list() for spec in tf.nest.flatten(given)] == [[26], [13], []]
    assert len(batches) == 8  # 250 examples, the last batch short
    assert_same_batches(batches, records.cache().shuffle(cfg.shuffle_buffer, seed=cfg.seed + shard.index).batch(32))
    if in_blocks:  # the trainer's own pipeline takes this way
        assert_same_batches(inputs.batches(cfg, shard, 32, repeat=False), batches)


def assert_same_batches(batches, expected):
    for (features, labels), (expected_features, expected_labels) in zip(batches, expected, strict=True):
        assert features.keys() == expected_features.keys()
        for name, column in features.items():
            assert column.dtype == expected_features[name].dtype
            np.testing.assert_array_equal(column.numpy(), expected_features[name].numpy(), err_msg=name)
        np.testing.assert_array_equal(labels.numpy(), expected_labels.numpy())


def test_an_example_with_no_two_scalars_of_a_dtype_is_batched_as_it_comes():
    records = inputs.DATASETS["synthetic"].records(CFG, "train", inputs.Shard(0, 1))
    given = []
    packing.batched(records, lambda dataset: given.append(dataset) or dataset.batch(8))
    assert given == [records]


# ---------------------------------------------------------------- bad records

def example(image=b"\x07" * 784, label=3):
    feature = {}
    if image is not None:
        feature["image"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))
    if label is not None:
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def read_all(data_dir, skip=False):
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(data_dir), skip_bad_records=skip)
    return [int(label) for _, label in tfrecord.records(cfg, "train", inputs.Shard(0, 1))]



def bad_record_error(data_dir):
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        read_all(data_dir)
    return inputs.bad_record_message(error.value.message)


BAD_RECORDS = {
    "missing label": (example(label=None), "needs one int64 'label' feature, has 0"),
    "missing image": (example(image=None), "needs one 'image' bytes feature, has 0"),
    "label out of range": (example(label=12), "'label' is 12, outside 0..9"),
    "negative label": (example(label=-1), "'label' is -1, outside 0..9"),
    "wrong image size": (example(image=b"\x01" * 100), "'image' has 100 bytes, expected 784 (28x28x1 uint8)"),
}


def test_a_bad_record_is_named_by_file_and_index_or_skipped_and_counted(tmp_path, capfd):
    # Good records, then each kind of bad one between good ones: the first bad record stops the read,
    # naming it; skipped, each is named with its own reason and counted, and every good record is read.
    cases = sorted(BAD_RECORDS)
    path = tmp_path / "train-00000-of-00001.tfrecord"
    write_records(path, [example(label=1), example(label=2),
                         *(record for case in cases for record in (BAD_RECORDS[case][0], example(label=4)))])
    assert bad_record_error(tmp_path) == f"bad input record: {path} record 2: {BAD_RECORDS[cases[0]][1]}"
    assert read_all(tmp_path, skip=True) == [1, 2] + [4] * len(cases)
    logged = capfd.readouterr().err
    for number, case in enumerate(cases, start=1):
        assert (f"skipped bad record {number} (so far, this worker): BadRecord: {path} record {2 * number}: "
                f"{BAD_RECORDS[case][1]}") in logged, case


def truncated_and_corrupt(tmp_path):
    """A file cut inside its 4th record, and one with a flipped byte inside its 3rd (of 5 each)."""
    whole = tmp_path / "whole.tfrecord"
    write_records(whole, [example(label=i) for i in range(5)])
    data = whole.read_bytes()
    whole.unlink()
    record = len(data) // 5
    truncated = tmp_path / "train-00000-of-00002.tfrecord"
    truncated.write_bytes(data[:3 * record + 20])
    corrupt = bytearray(data)
    corrupt[2 * record + 40] ^= 0xFF
    (tmp_path / "train-00001-of-00002.tfrecord").write_bytes(bytes(corrupt))
    return truncated, tmp_path / "train-00001-of-00002.tfrecord", len(data)


def test_a_truncated_or_corrupt_file_is_named_with_the_first_record_lost(tmp_path):
    truncated, corrupt, size = truncated_and_corrupt(tmp_path)
    record = size // 5
    # Whole blocks are read before a file's end is checked: the truncated file, first in the
    # interleave, is reported first; without it, the corrupt one.
    assert bad_record_error(tmp_path) == (
        f"bad input record: {truncated} record 3: cannot be read past byte {3 * record} of {3 * record + 20} "
        "(truncated or corrupt): this record and any after it are lost")
    truncated.unlink()
    assert bad_record_error(tmp_path) == (
        f"bad input record: {corrupt} record 2: cannot be read past byte {2 * record} of {size} "
        "(truncated or corrupt): this record and any after it are lost")


def test_a_record_that_is_no_example_is_named_by_tensorflows_parse_error(tmp_path):
    path = tmp_path / "train-00000-of-00001.tfrecord"
    wrong_kind = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))}))
    write_records(path, [example(), wrong_kind, example()])
    message = bad_record_error(tmp_path)
    assert message.startswith(f"bad input record: {path} record 1: feature 'image': ")
    assert "Data types don't match" in message


def test_skip_bad_records_keeps_what_a_damaged_file_still_holds(tmp_path, capfd):
    truncated_and_corrupt(tmp_path)
    assert sorted(read_all(tmp_path, skip=True)) == [0, 0, 1, 1, 2]
    logged = capfd.readouterr().err
    assert logged.count("skipped bad record") == 2 and "skipped bad record 2 (so far" in logged


def test_good_files_give_no_problem_and_every_record(tfrecord_dir):
    assert len(read_all(tfrecord_dir)) == 120 == len(read_all(tfrecord_dir, skip=True))


# ---------------------------------------------------------------- csv and idx

def write_csv(path, rows, header="id,price,city,clicked,ignored", added=""):
    path.write_text(header + "\n" + "".join(f"{i},{i * 1.5},c{i % 3},{i % 2},x{added}\n" for i in rows))


CSV = dict(name="csv", label_column="clicked", numeric_columns=("price",), categorical_columns=("city",))


def csv_epoch(cfg, shard, split="train"):
    return sorted((float(f["price"]), f["city"].numpy().decode(), int(label))
                  for f, label in inputs.DATASETS["csv"].records(cfg, split, shard))


def test_csv_reads_the_named_columns_and_shards_disjointly(tmp_path):
    write_csv(tmp_path / "train-0.csv", range(0, 10))
    write_csv(tmp_path / "train-1.csv", range(10, 16))
    cfg = inputs.DataConfig(data_dir=str(tmp_path), **CSV)
    assert inputs.DATASETS["csv"].check(cfg) is None
    whole = csv_epoch(cfg, inputs.Shard(0, 1))
    assert whole == sorted((i * 1.5, f"c{i % 3}", i % 2) for i in range(16))
    for workers in (2, 3):  # 2: by file, 3: by row
        shards = [csv_epoch(cfg, inputs.Shard(i, workers)) for i in range(workers)]
        assert all(shards) and sorted(r for s in shards for r in s) == whole, workers


def test_csv_eval_data_dir_and_errors_name_the_file(tmp_path):
    write_csv(tmp_path / "train-0.csv", range(4))
    (tmp_path / "held").mkdir()
    write_csv(tmp_path / "held" / "eval-0.csv", range(100, 102))
    cfg = inputs.DataConfig(data_dir=str(tmp_path), eval_data_dir=str(tmp_path / "held"), **CSV)
    assert [r[0] for r in csv_epoch(cfg, inputs.Shard(0, 1), "eval")] == [150.0, 151.5]
    bad = inputs.DataConfig(data_dir=str(tmp_path), **{**CSV, "numeric_columns": ("cost",)})
    assert inputs.DATASETS["csv"].check(bad) == (
        f"{tmp_path}/train-0.csv: no column 'cost' in its header (id, price, city, clicked, ignored).")
    write_csv(tmp_path / "train-0.csv", range(4), header="id,price,city,clicked,price")
    assert inputs.DATASETS["csv"].check(cfg) == (
        f"{tmp_path}/train-0.csv: column 'price' is in its header 2 times: which one to read?")
    (tmp_path / "train-0.csv").write_text("id,price,city,clicked,ignored\n1,2.0,a,1,x\n2,3.0,b,7,x\n")
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        csv_epoch(cfg, inputs.Shard(0, 1))
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {tmp_path}/train-0.csv record 2: 'clicked' is 7, outside 0..1")


def test_csv_empty_fields_read_as_defaults_and_an_empty_label_is_named(tmp_path):
    # Real click logs have empty fields everywhere; CsvDataset's dtype-only defaults refuse them.
    (tmp_path / "train-0.csv").write_text("id,price,city,clicked,ignored\n1,,a,1,\n2,3.0,,0,x\n")
    cfg = inputs.DataConfig(data_dir=str(tmp_path), numeric_default=-1.0, **CSV)
    assert csv_epoch(cfg, inputs.Shard(0, 1)) == [(-1.0, "a", 1), (3.0, "", 0)]
    (tmp_path / "train-0.csv").write_text("id,price,city,clicked,ignored\n1,2.0,a,1,x\n2,3.0,b,,x\n")
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        csv_epoch(cfg, inputs.Shard(0, 1))
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {tmp_path}/train-0.csv record 2: 'clicked' is empty")


def test_a_file_whose_header_moved_a_read_column_is_named_and_one_that_only_added_columns_is_read(tmp_path):
    # Columns are read by their places in the first file's header: a later log with a column added in
    # front was read shifted (here 'clicked' from 'city': a stop on 'c1', naming no file). An empty file
    # stopped training too ("Can't read header of file").
    write_csv(tmp_path / "train-0.csv", range(4))
    write_csv(tmp_path / "train-1.csv", range(4, 6), header='id,price,city,clicked,ignored,"added"',
              added=",new")  # at the end
    (tmp_path / "train-2.csv").write_text("")  # no rows to misread
    cfg = inputs.DataConfig(data_dir=str(tmp_path), **CSV)
    assert csv_epoch(cfg, inputs.Shard(0, 1)) == sorted((i * 1.5, f"c{i % 3}", i % 2) for i in range(6))
    (tmp_path / "train-2.csv").write_text("day,id,price,city,clicked,ignored\r\n7,1,1.5,c1,1,x\r\n")
    for skip in (False, True):  # not a bad row to skip: the whole file is misread
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            csv_epoch(dataclasses.replace(cfg, skip_bad_records=skip), inputs.Shard(0, 1))
        assert inputs.bad_record_message(error.value.message) == (
            f"bad input record: {tmp_path}/train-2.csv record 0: its header does not have the columns this run "
            f"reads where {tmp_path}/train-0.csv has them ('price' at 2, 'city' at 3, 'clicked' at 4): give every "
            "file one header, or convert the files")


def test_a_csv_row_that_cannot_be_read_as_its_header_says_is_named_or_skipped_and_the_rest_is_read(tmp_path,
                                                                                                   capfd):
    # CsvDataset stopped on these naming neither file nor row ("Expect 3 fields but have 1 in record", with
    # a traceback), --skip_bad_records could not skip them, and a row missing a field before the read
    # columns was read shifted without a word. A gzipped file's cut last row is one of them. Good rows,
    # then each kind of bad one between good ones: the first bad row stops the read, naming it; skipped,
    # each is named with its own reason, and every good row is read.
    good = ['1,2.5,"Paris, FR",1,x', '2,-3e1,"say ""hi""",0,', '3, 4 ,c,1,x']
    bad = {'4,5.0,c,1': "has 4 comma-separated fields where its header has 5",
           '5,5.0,c,1,x,extra': "has 6 comma-separated fields where its header has 5",
           '6,5.0,a"b,1,x': "a quote in it does not enclose its whole field (a row is one line)",
           '7,5.0,"open,1,x': "a quote in it does not enclose its whole field (a row is one line)",
           '8,cheap,c,1,x': "'price' is 'cheap', not a number",
           '9,5.0,c,yes,x': "'clicked' is 'yes', not an integer",
           '10,5.0,c,2,x': "'clicked' is 2, outside 0..1"}
    rows = [*good, *(line for row in bad for line in (row, good[0]))]
    text = "\ufeffid,price,city,clicked,ignored\r\n" + "".join(f"{row}\r\n" for row in rows)
    with gzip.open(tmp_path / "train-0.csv.gz", "wt", encoding="utf-8", newline="") as f:
        f.write(text)
    path = f"{tmp_path}/train-0.csv.gz"
    cfg = inputs.DataConfig(data_dir=str(tmp_path), **CSV)
    assert inputs.DATASETS["csv"].check(cfg) is None and inputs.formats_in(str(tmp_path)) == ["csv"]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        csv_epoch(cfg, inputs.Shard(0, 1))
    first_bad = next(iter(bad))
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {path} record {rows.index(first_bad) + 1}: {bad[first_bad]}")
    read = [(2.5, "Paris, FR", 1), (-30.0, 'say "hi"', 0), (4.0, "c", 1)] + [(2.5, "Paris, FR", 1)] * len(bad)
    assert csv_epoch(dataclasses.replace(cfg, skip_bad_records=True), inputs.Shard(0, 1)) == sorted(read)
    logged = capfd.readouterr().err
    for number, (row, problem) in enumerate(bad.items(), start=1):
        assert (f"skipped bad record {number} (so far, this worker): BadRecord: {path} "
                f"record {rows.index(row) + 1}: {problem}") in logged, row
    (tmp_path / "train-1.csv.gz").write_text(text)  # not gzip: refused at startup, named
    assert inputs.DATASETS["csv"].check(cfg) == (f"{tmp_path}/train-1.csv.gz: its name ends in .gz, which is read "
                                                 "as gzip, but it is not gzip data: rename or compress it.")


def test_tab_separated_files_with_a_header_are_read_by_their_names_and_one_kind_per_split(tmp_path):
    write_csv(tmp_path / "train-0.csv", range(6))
    cfg = inputs.DataConfig(data_dir=str(tmp_path), **CSV)
    from_csv = csv_epoch(cfg, inputs.Shard(0, 1))
    text = (tmp_path / "train-0.csv").read_text().replace(",", "\t")
    (tmp_path / "train-0.tsv").write_text(text + '6\t"a, b"\tc\t1\n')  # a comma is a field's own
    assert inputs.DATASETS["csv"].check(cfg) == (
        f"{tmp_path} holds both comma-separated (.csv) and tab-separated (.tsv) train files: give one kind.")
    (tmp_path / "train-0.csv").unlink()
    assert inputs.DATASETS["csv"].check(cfg) is None and inputs.formats_in(str(tmp_path)) == ["csv"]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        csv_epoch(cfg, inputs.Shard(0, 1))
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {tmp_path}/train-0.tsv record 7: has 4 tab-separated fields where its header has 5")
    (tmp_path / "train-0.tsv").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "train-0.tsv").rename(tmp_path / "train-0.tsv.gz")
    assert csv_epoch(cfg, inputs.Shard(0, 1)) == from_csv
    # TSV has no quoting: a quote is a field's text (a user agent's, a search's), as is a comma.
    (tmp_path / "train-0.tsv.gz").write_bytes(gzip.compress((text + '6\t1.5\tsaid "hi\t0\tx\n7\t2\t"a, b"\t1\tx\n'
                                                             ).encode()))
    assert csv_epoch(cfg, inputs.Shard(0, 1)) == sorted(from_csv + [(1.5, 'said "hi', 0), (2.0, '"a, b"', 1)])


def test_the_chief_says_when_too_few_files_leave_workers_waiting_with_the_input_queue():
    # One file (Criteo's train.txt), 2 workers, --num_epochs=1: one worker trained, the chief waited, and
    # nothing said why.
    assert work_queue.few_files_warning(1, 2, 1) == (
        "--input_queue: 1 training file(s) for 2 workers: a file is read by one worker at a time, so at most 1 of "
        "them train within an epoch and the others wait. Split the data into 2 or more files to keep every worker "
        "busy (GNU split -n l/2 keeps rows whole; give each CSV part the header)")
    warning = work_queue.few_files_warning(3, 8, 0)
    assert "at most 3 of them train within an epoch (6 while two epochs overlap)" in warning
    assert work_queue.few_files_warning(2, 2, 1) is None and work_queue.few_files_warning(40, 8, 3) is None


def criteo_row(label="1", integers=("5", "", "12") + ("0",) * 10, categoricals=("68fd1e64", "") + ("a",) * 24):
    return "\t".join([label, *integers, *categoricals]) + "\n"


def criteo_epoch(cfg, shard=inputs.Shard(0, 1)):  # noqa: B008  (a Shard is a frozen value)
    return [({name: value.numpy() for name, value in features.items()}, int(label))
            for features, label in inputs.DATASETS["criteo"].records(cfg, "train", shard)]


def test_criteo_layout_reads_empty_fields_as_defaults_and_shards_by_row(tmp_path):
    (tmp_path / "train.txt").write_text(criteo_row() + criteo_row(label="0", integers=("",) * 13) + criteo_row())
    cfg = inputs.DataConfig(name="criteo", data_dir=str(tmp_path), numeric_default=0.0)
    assert inputs.DATASETS["criteo"].check(cfg) is None and not inputs.formats_in(str(tmp_path))
    rows = criteo_epoch(cfg)
    assert [label for _, label in rows] == [1, 0, 1]
    first, second = rows[0][0], rows[1][0]
    assert (first["I1"], first["I2"], first["I3"]) == (5.0, 0.0, 12.0) and second["I1"] == 0.0
    assert (first["C1"], first["C2"]) == (b"68fd1e64", b"")
    assert set(first) == {f"I{i}" for i in range(1, 14)} | {f"C{i}" for i in range(1, 27)}
    assert [len(criteo_epoch(cfg, inputs.Shard(i, 2))) for i in (0, 1)] == [2, 1]  # one file: every other row


def test_criteo_days_gzipped_as_criteo_publishes_them_read_as_plain_ones(tmp_path):
    # Read as plain text before, a gzipped day stopped at its first row: "has 2 tab-separated fields".
    text = criteo_row() + criteo_row(label="0", integers=("",) * 13) + criteo_row()
    (tmp_path / "train-day_0.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "train-day_1").write_text(text)
    cfg = inputs.DataConfig(name="criteo", data_dir=str(tmp_path))
    gzipped, plain = (criteo_epoch(cfg, inputs.Shard(i, 2)) for i in (0, 1))  # a file each
    assert [label for _, label in gzipped] == [1, 0, 1]
    assert all(a.keys() == b.keys() and all(a[k] == b[k] for k in a) for (a, _), (b, _) in zip(gzipped, plain))


def test_every_source_reads_its_records_without_the_autotuner(tfrecord_dir, tmp_path):
    # tf.data's autotuner wakes on a timer that grows toward a minute, and deleting an iterator waits for
    # it: a script's or a test's read of a source's records stalled up to a minute at its end.
    from ps_trainer.input import idx
    for name in ("csv", "criteo", "idx"):
        (tmp_path / name).mkdir()
    write_csv(tmp_path / "csv" / "train-0.csv", range(4))
    (tmp_path / "criteo" / "train.txt").write_text(criteo_row())
    idx.write(np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.int64), str(tmp_path / "idx"), "train", False)
    configs = {"synthetic": CFG, "clicks": inputs.DataConfig(name="clicks", synthetic_examples=10),
               "zipf_clicks": inputs.DataConfig(name="zipf_clicks", synthetic_examples=10),
               "tfrecord": inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir)),
               "csv": inputs.DataConfig(data_dir=str(tmp_path / "csv"), **CSV),
               "criteo": inputs.DataConfig(name="criteo", data_dir=str(tmp_path / "criteo")),
               "idx": inputs.DataConfig(name="idx", data_dir=str(tmp_path / "idx"))}
    assert sorted(configs) == sorted(inputs.DATASETS)
    for name, cfg in configs.items():
        records = inputs.DATASETS[name].records(cfg, "train", inputs.Shard(0, 1))
        assert records.options().autotune.enabled is False, name
        features, label = next(iter(records))
        assert set(features) == set(inputs.DATASETS[name].spec(cfg).features) and label.shape == (), name


CRITEO_BAD = {
    "a field missing": (criteo_row()[:-3] + "\n", "has 39 tab-separated fields, not 40 (label, I1..I13, C1..C26)"),
    "an empty label": (criteo_row(label=""), "'label' is empty"),
    "a label not 0 or 1": (criteo_row(label="2"), "'label' is '2', not 0 or 1"),
    "a word for a count": (criteo_row(integers=("5", "many") + ("0",) * 11), "'I2' is 'many', not an integer"),
}


def test_a_bad_criteo_row_is_named_by_file_and_line_or_skipped(tmp_path, capfd):
    # A good row, then each kind of bad one, then a good one: the first bad row stops the read, naming it;
    # skipped, each is named with its own reason, and the good rows are read.
    cases = sorted(CRITEO_BAD)
    path = tmp_path / "train-day_0"
    path.write_text(criteo_row() + "".join(CRITEO_BAD[case][0] for case in cases) + criteo_row())
    cfg = inputs.DataConfig(name="criteo", data_dir=str(tmp_path))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        criteo_epoch(cfg)
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {path} record 2: {CRITEO_BAD[cases[0]][1]}")
    skipped = criteo_epoch(dataclasses.replace(cfg, skip_bad_records=True))
    assert len(skipped) == 2
    logged = capfd.readouterr().err
    for number, case in enumerate(cases, start=1):
        assert (f"skipped bad record {number} (so far, this worker): BadRecord: {path} record {number + 1}: "
                f"{CRITEO_BAD[case][1]}") in logged, case


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
def test_idx_files_read_back_and_shard(tmp_path, compress):
    from ps_trainer.input import idx
    rng = np.random.RandomState(0)
    images, labels = rng.randint(0, 256, (30, 28, 28)).astype(np.uint8), rng.randint(0, 10, 30)
    idx.write(images, labels, str(tmp_path), "train", compress)
    idx.write(images[:5], labels[:5], str(tmp_path), "eval", compress)
    cfg = inputs.DataConfig(name="idx", data_dir=str(tmp_path))
    assert idx.check(cfg) is None
    read = epoch(cfg, inputs.Shard(0, 1))
    assert read == [(image.tobytes(), int(label)) for image, label in zip(images, labels)]
    shards = [epoch(cfg, inputs.Shard(i, 2)) for i in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(read) and not set(shards[0]) & set(shards[1])
    assert len(epoch(cfg, inputs.Shard(0, 1), "eval")) == 5


def test_idx_header_problems_name_the_file(tmp_path):
    from ps_trainer.input import idx
    images, labels = np.zeros((4, 28, 28), np.uint8), np.zeros(4, np.uint8)
    image_path, label_path = idx.write(images, labels, str(tmp_path), "train")
    cfg = inputs.DataConfig(name="idx", data_dir=str(tmp_path))
    idx.write(images, labels[:3], str(tmp_path), "train")
    assert idx.check(cfg) == f"{label_path} holds 3 labels but {image_path} holds 4 images"
    idx.write(images, labels, str(tmp_path), "train")
    pathlib.Path(image_path).write_bytes(pathlib.Path(image_path).read_bytes()[:-10])
    assert idx.check(cfg).startswith(f"{image_path}: the header announces 4 records of 784 byte(s)")
    pathlib.Path(image_path).write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 20)
    assert idx.check(cfg).startswith(f"{image_path}: not an IDX file of this kind")
    assert idx.check(inputs.DataConfig(name="idx", data_dir=str(tmp_path / "none"))).endswith(
        "train-images-idx3-ubyte[.gz] not found")


def test_clicks_are_learnable_from_the_ids():
    cfg = inputs.DataConfig(name="clicks", synthetic_examples=3000)
    # In batches: an eager step per example would cost milliseconds each.
    batches = inputs.DATASETS["clicks"].records(cfg, "train", inputs.Shard(0, 1)).batch(1000)
    users, labels = map(np.concatenate, zip(*[(f["user"].numpy(), label.numpy()) for f, label in batches]))
    assert len(labels) == 3000 and 0.2 < labels.mean() < 0.8
    assert all(user.startswith(b"u") for user in users)


def test_idx_labels_out_of_range_are_named_or_skipped(tmp_path, capfd):
    from ps_trainer.input import idx
    images, labels = np.zeros((6, 28, 28), np.uint8), np.array([1, 2, 11, 3, 255, 4], np.uint8)
    _, labels_path = idx.write(images, labels, str(tmp_path), "train")
    cfg = inputs.DataConfig(name="idx", data_dir=str(tmp_path))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        epoch(cfg, inputs.Shard(0, 1))
    assert inputs.bad_record_message(error.value.message) == (
        f"bad input record: {labels_path} record 2: 'label' is 11, outside 0..9")
    skipping = inputs.DataConfig(name="idx", data_dir=str(tmp_path), skip_bad_records=True)
    assert [label for _, label in epoch(skipping, inputs.Shard(0, 1))] == [1, 2, 3, 4]
    assert f"skipped bad record 2 (so far, this worker): BadRecord: {labels_path} record 4: 'label' is 255" in (
        capfd.readouterr().err)
    # Sharded, a record keeps its index in the file.
    assert [label for _, label in epoch(skipping, inputs.Shard(1, 2))] == [2, 3, 4]
    assert [label for _, label in epoch(skipping, inputs.Shard(0, 2))] == [1]
    assert f"{labels_path} record 4: 'label' is 255" in capfd.readouterr().err


# ---------------------------------------------------------------- memory

def rss_bytes() -> int:
    return int(pathlib.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth(cfg, records: int) -> int:
    """How much this process's RSS grows over the last three quarters of one epoch of batches,
    once the shuffle buffer is full."""
    seen, start, peak = 0, None, 0
    for _, labels in inputs.batches(cfg, inputs.Shard(0, 1), 256, repeat=False):
        seen += int(labels.shape[0])
        if seen >= records // 4:
            start = start or rss_bytes()
            peak = max(peak, rss_bytes())
    assert seen == records
    return peak - start


def test_files_are_streamed_in_bounded_memory_and_memory_cache_holds_the_shard(tmp_path):
    # 64 MB of images, over six times the shuffle buffer.
    records = 6 * inputs.DataConfig.shuffle_buffer + 20000
    # 1,000 random images over and over: each record is still decoded (and cached) as its own tensor.
    pool = np.random.RandomState(0).randint(0, 256, (1000, 28, 28, 1), np.uint8)
    tfrecord.write((({"image": pool[i % len(pool)]}, i % 10) for i in range(records)), synthetic.spec(CFG),
                   str(tmp_path), "train", num_files=4)
    streamed = inputs.DataConfig(name="tfrecord", data_dir=str(tmp_path))
    assert inputs.cache_mode(streamed) == "none"
    assert rss_growth(streamed, records) < 16 * 2**20
    # The same measurement sees the memory cache hold three quarters of the shard (48 MB decoded).
    cached = inputs.DataConfig(name="tfrecord", data_dir=str(tmp_path), cache="memory")
    assert rss_growth(cached, records) > 32 * 2**20


def test_a_cache_directory_is_written_once_and_reread(tmp_path, tfrecord_dir):
    cache = tmp_path / "cache"
    cache.mkdir()
    # The lock file of a writer that died does not stop the next one (TensorFlow alone refuses).
    (cache / "train-packed-shard-0-of-1_0.lockfile").write_text("")
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir), cache=str(cache))
    first = sorted(epoch_of_batches(cfg))
    assert list(cache.glob("train-packed-shard-0-of-1*.index"))
    # New files, all labels 0: the next pass still reads the cache.
    tfrecord.write([({"image": np.zeros((28, 28, 1), np.uint8)}, 0)] * 120, synthetic.spec(CFG),
                   str(tfrecord_dir), "train", num_files=3)
    assert sorted(epoch_of_batches(cfg)) == first and len(first) == 120 and set(first) != {0}


def epoch_of_batches(cfg):
    return [int(label) for _, labels in inputs.batches(cfg, inputs.Shard(0, 1), 16, repeat=False)
            for label in labels]


def test_the_startup_line_says_what_each_worker_reads(tfrecord_dir):
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir))
    assert inputs.describe(cfg, inputs.Shard(1, 2)) == (
        f"dataset tfrecord from {tfrecord_dir}, train split: 1 of 3 files (train-00001-of-00003.tfrecord) "
        "(worker shard 1 of 2); cache: none")
    assert inputs.describe(cfg, inputs.Shard(1, 4)) == (
        f"dataset tfrecord from {tfrecord_dir}, train split: records 1, 5, ... (one in 4) of each of 3 file(s) "
        "(worker shard 1 of 4); cache: none")
    assert inputs.describe(CFG, inputs.Shard(0, 1)) == (
        "dataset synthetic, train split: all 120 generated from seed 7 (worker shard 0 of 1); cache: memory")


def test_every_source_has_the_interface_input_names_and_csv_says_what_a_worker_reads(tmp_path):
    # csv_files lost its shard_description once, and every run of one process on CSV files stopped at
    # its start-up line with an AttributeError.
    for name, source in inputs.DATASETS.items():
        for function in ("check", "spec", "records", "shard_description") + (
                ("found_in",) if source.KIND == "files" else ()):
            assert callable(getattr(source, function, None)), f"{name} has no {function}()"
    write_csv(tmp_path / "train-0.csv", range(4))
    write_csv(tmp_path / "train-1.csv", range(4, 6))
    assert inputs.describe(inputs.DataConfig(data_dir=str(tmp_path), **CSV), inputs.Shard(1, 2)) == (
        f"dataset csv from {tmp_path}, train split: 1 of 2 files (train-1.csv) (worker shard 1 of 2); cache: none")


ZIPF = inputs.DataConfig(name="zipf_clicks", synthetic_examples=8000, seed=3)


def zipf_rows(cfg, shard, split="train"):
    rows = inputs.DATASETS["zipf_clicks"].records(cfg, split, shard).batch(4096)
    columns = {}
    for features, labels in rows:
        for name, values in [*features.items(), ("label", labels)]:
            columns.setdefault(name, []).append(values.numpy())
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def test_zipf_clicks_shards_are_one_epoch_and_ids_follow_zipfs_law_with_a_label_that_depends_on_them():
    whole = zipf_rows(ZIPF, inputs.Shard(0, 1))
    halves = [zipf_rows(ZIPF, inputs.Shard(i, 2)) for i in (0, 1)]
    # Shard i of 2 holds examples i, i + 2, ...: the same examples, made alone.
    for name in ("C26", "I1", "label"):
        np.testing.assert_array_equal(halves[0][name], whole[name][0::2])
        np.testing.assert_array_equal(halves[1][name], whole[name][1::2])
    assert len(set(whole["C1"])) == 3
    assert not set(whole["C1"]) & set(whole["C2"])  # each column its own IDs
    # Zipf's law: the most frequent ID of the million-value column is everywhere, most are seen once.
    _, counts = np.unique(whole["C26"], return_counts=True)
    assert counts.max() > 0.05 * len(whole["C26"]) and np.median(counts) == 1
    distinct = sum(len(set(whole[f"C{i}"])) for i in range(1, 27))
    assert abs(distinct - zipf_clicks.expected_distinct_ids(8000)) < 0.1 * distinct
    # The label depends on the IDs: the click rate of the most frequent C26 ID is not the overall one
    # for every column (the affinities are per ID).
    rate = whole["label"].mean()
    assert 0.15 < rate < 0.45
    gaps = []
    for i in range(14, 27):
        values, counts = np.unique(whole[f"C{i}"], return_counts=True)
        top = values[np.argmax(counts)]
        gaps.append(abs(whole["label"][whole[f"C{i}"] == top].mean() - rate))
    assert max(gaps) > 0.05, gaps
