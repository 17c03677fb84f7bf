"""Where data and models may live: what tf.io.gfile in TensorFlow 2.21 can open, as installed.

Local paths and file:// work; gs:// is built into TensorFlow (it needs network access to Google
Cloud Storage and credentials, e.g. GOOGLE_APPLICATION_CREDENTIALS). s3:// and hdfs:// were moved
out of TensorFlow into the tensorflow-io plugin, whose last release (0.37.1, built for TF 2.17)
fails to load in 2.21 (undefined symbols): no plugin exists for them, so a path of theirs is
refused at startup with what to do instead, not met as a traceback mid-run.
"""

import os

import tensorflow as tf

ADVICE = {
    "s3": "mount the bucket (mountpoint-s3 or s3fs; on SageMaker, an input channel or "
          "/opt/ml/checkpoints with checkpoint_s3_uri) and pass the mounted path",
    "hdfs": "mount HDFS (fuse-dfs or the NFS gateway) and pass the mounted path",
}


def problem(flag: str, path: str | None) -> str | None:
    """A one-line reason why `--flag=path` cannot be used, or None."""
    if not path or "://" not in path:
        return None
    scheme = path.split("://", 1)[0]
    try:
        tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError:
        advice = ADVICE.get(scheme, "use a local or mounted path, or gs://")
        return (f"--{flag}={path}: TensorFlow {tf.__version__} cannot open {scheme}:// paths (its "
                f"file system plugin, tensorflow-io, has no build for it): {advice}.")
    except tf.errors.OpError as err:
        return f"--{flag}={path}: cannot be reached: {err.message.splitlines()[0]}"
    return None


def write_whole(path: str, text: str) -> None:
    """Writes text under a temporary name, then renames it into place: a reader of path (another
    task, maybe on another host) sees the old file or the new one, never half of one."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path + ".tmp", "w") as out:
        out.write(text)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
