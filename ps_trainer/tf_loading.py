"""How a process of the trainer's loads TensorFlow: without the start-up notices its C++ side prints, and
without the Keras it loads eagerly for nothing the trainer uses. trainer.py's tasks load it so, and the test
processes too (tests/conftest.py)."""

import contextlib
import os
import re
import sys
import tempfile

# TensorFlow's C++ start-up notices (oneDNN, CPU features, absl's "before InitializeLog" warning, and the
# CUDA build's "no cuda drivers" on a host without a GPU), printed by every process as TensorFlow loads,
# are INFO that TF_CPP_MIN_LOG_LEVEL cannot hold back. The imports run with stderr in a file; every other
# line written meanwhile is passed on.
STARTUP_NOTICES = re.compile(r"\] oneDNN custom operations are on|cpu_feature_guard\.cc|^To enable the following "
                             r"instructions|^WARNING: All log messages before absl::InitializeLog|"
                             r"cudart_stub\.cc:\d+\] Could not find cuda drivers|\] failed call to cuInit: ")
NO_CUDA_DRIVER = "Could not find cuda drivers"


@contextlib.contextmanager
def startup_notices_dropped(show_all: bool):
    if show_all:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
            _probe_devices_without_driver(captured)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not STARTUP_NOTICES.search(line):
                    sys.stderr.write(line)


def _probe_devices_without_driver(captured):
    """The CUDA build of TensorFlow on a host without a GPU driver logs an error, "failed call to cuInit", at
    the process's first use of its devices. Where the load said there is no driver, that first use happens
    here, inside the capture. With a driver, CUDA stays uninitialised: a process that forks tasks must not
    initialise it."""
    captured.seek(0)
    if NO_CUDA_DRIVER.encode() in captured.read() and "tensorflow" in sys.modules:
        sys.modules["tensorflow"].config.list_physical_devices("GPU")


# What TensorFlow loads at import for Keras (keras.src.optimizers, or tf_keras's with TF_USE_LEGACY_KERAS)
# to register Keras optimizers with SavedModel. It loads all of Keras 3, and matplotlib.pyplot with it
# where matplotlib is installed: about 1 s of CPU at every task's start (docs/speed.md), for objects no
# task uses (the models are tf.compat.v1 variables and tf.nn ops, the export a v1 SavedModel).
KERAS_LOADED_BY_TENSORFLOW = ("keras.src.optimizers", "tf_keras.src.optimizers")


@contextlib.contextmanager
def keras_hidden():
    """While TensorFlow loads, importing the Keras it loads eagerly fails (TensorFlow takes the
    ImportError as "Keras not installed"); after, `tf.keras` and `import keras` load it as usual."""
    hidden = [name for name in KERAS_LOADED_BY_TENSORFLOW if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's mark for "raise ImportError"
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
