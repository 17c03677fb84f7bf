"""MNIST's IDX files, the format many TF1 scripts were written for: in --data_dir,
train-images-idx3-ubyte and train-labels-idx1-ubyte for training, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte for evaluation (or in --eval_data_dir), each optionally gzipped (.gz).

The headers are checked before training (magic number, sizes, that images and labels agree and
that the file holds every record its header announces); records are read lazily and split
between workers by index.
"""

import gzip
import os
import struct

import tensorflow as tf

from ps_trainer.input import records as record_files
from ps_trainer.input import packing, synthetic, tuning

IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
IMAGE_HEADER_BYTES, LABEL_HEADER_BYTES = 16, 8
PREFIX = {"train": "train", "eval": "t10k"}
NUM_CLASSES = synthetic.NUM_CLASSES


class IdxError(ValueError):
    pass


KIND = "files"
MULTI_VALUED = ()  # no multi-valued columns
files = None  # one file of images, one of labels: nothing the input queue could hand out by file


def paths(data_cfg, split: str) -> tuple[str, str]:
    """The (images, labels) files of a split, .gz or not."""
    data_dir = data_cfg.split_dir(split)
    found = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        name = os.path.join(data_dir, f"{PREFIX[split]}-{kind}")
        candidates = [p for p in (name, name + ".gz") if tf.io.gfile.exists(p)]
        if not candidates:
            raise IdxError(f"{name}[.gz] not found")
        found.append(candidates[0])
    return found[0], found[1]


def _open(path):
    raw = tf.io.gfile.GFile(path, "rb")
    return gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw


def _data_bytes(path, header_bytes) -> int:
    if not path.endswith(".gz"):
        return tf.io.gfile.stat(path).length - header_bytes
    with _open(path) as f:
        f.seek(0, os.SEEK_END)
        return f.tell() - header_bytes


def read_header(path: str, magic: int) -> tuple[int, ...]:
    """The dimensions in an IDX header; IdxError naming the file if it is not the expected kind."""
    with _open(path) as f:
        head = f.read(4)
        if len(head) < 4 or struct.unpack(">I", head)[0] != magic:
            raise IdxError(f"{path}: not an IDX file of this kind (magic number "
                           f"{head.hex() or 'missing'}, expected {magic:08x})")
        ndims = magic & 0xFF
        return struct.unpack(f">{ndims}I", f.read(4 * ndims))


def check_split(data_cfg, split: str) -> int:
    """Number of examples of a split; IdxError naming the file at fault."""
    images_path, labels_path = paths(data_cfg, split)
    count, rows, cols = read_header(images_path, IMAGE_MAGIC)
    (label_count,) = read_header(labels_path, LABEL_MAGIC)
    if (rows, cols) != synthetic.IMAGE_SHAPE[:2]:
        raise IdxError(f"{images_path}: images are {rows}x{cols}, expected 28x28")
    if label_count != count:
        raise IdxError(f"{labels_path} holds {label_count} labels but {images_path} holds {count} images")
    for path, header, size in ((images_path, IMAGE_HEADER_BYTES, rows * cols), (labels_path, LABEL_HEADER_BYTES, 1)):
        held = _data_bytes(path, header)
        if held != count * size:
            raise IdxError(f"{path}: the header announces {count} records of {size} byte(s), the file holds "
                           f"{held} bytes of data (truncated or padded)")
    return count


def found_in(data_dir: str) -> bool:
    name = os.path.join(data_dir, f"{PREFIX['train']}-images-idx3-ubyte")
    return tf.io.gfile.exists(name) or tf.io.gfile.exists(name + ".gz")


def check(data_cfg):
    if not data_cfg.data_dir:
        return "--dataset=idx needs --data_dir: a directory of MNIST IDX files (train-images-idx3-ubyte, ...)."
    try:
        check_split(data_cfg, "train")
        if data_cfg.eval_data_dir:
            check_split(data_cfg, "eval")
    except IdxError as err:
        return str(err)
    return None


def spec(data_cfg):
    return synthetic.spec(data_cfg)


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    images_path, labels_path = paths(data_cfg, split)

    def fixed(path, size, header):
        return tf.data.FixedLengthRecordDataset(path, size, header_bytes=header, buffer_size=1 << 20,
                                                compression_type="GZIP" if path.endswith(".gz") else None)

    pairs = tf.data.Dataset.zip((fixed(images_path, 28 * 28, IMAGE_HEADER_BYTES),
                                 fixed(labels_path, 1, LABEL_HEADER_BYTES)))
    if shard.count > 1:
        pairs = pairs.shard(shard.count, shard.index)

    def decode(block_number, block):
        images, labels = block
        labels = tf.cast(tf.io.decode_raw(labels, tf.uint8)[:, 0], tf.int64)
        indices = record_files.block_indices(block_number, tf.size(labels), shard.index, shard.count)
        bad, problems = record_files.name_bad_records(labels_path, indices,
                                              [record_files.label_failure(labels, "label", NUM_CLASSES)])
        images = tf.reshape(tf.io.decode_raw(images, tf.uint8), [-1, *synthetic.IMAGE_SHAPE])
        return record_files.resolve(bad, problems, ({"image": images}, labels), data_cfg.skip_bad_records)

    blocks = pairs.batch(record_files.BLOCK).enumerate().map(
        decode, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)
    return record_files.settle(blocks, data_cfg.skip_bad_records)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    images_path, labels_path = paths(data_cfg, split)
    if shard.count == 1:
        return f"every record of {os.path.basename(images_path)} and {os.path.basename(labels_path)}"
    return (f"records {shard.index}, {shard.index + shard.count}, ... (one in {shard.count}) of "
            f"{os.path.basename(images_path)} and {os.path.basename(labels_path)}")


def write(images, labels, data_dir: str, split: str, compress: bool = False) -> tuple[str, str]:
    """Writes uint8 [N, 28, 28] images and [N] labels as IDX files (as MNIST ships them)."""
    tf.io.gfile.makedirs(data_dir)
    suffix = ".gz" if compress else ""
    out = []
    for kind, magic, array in (("images-idx3-ubyte", IMAGE_MAGIC, images), ("labels-idx1-ubyte", LABEL_MAGIC, labels)):
        path = os.path.join(data_dir, f"{PREFIX[split]}-{kind}{suffix}")
        data = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype("uint8").tobytes()
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(gzip.compress(data) if compress else data)
        out.append(path)
    return out[0], out[1]
