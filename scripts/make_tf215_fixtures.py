#!/usr/bin/env python3
"""Writes tests/data/tf215/: checkpoints the real Estimator (TensorFlow 2.15.1, tensorflow-estimator 2.15.0)
wrote for each case of tests/programs/tf215_cases.py, trained tf215_cases.STEPS steps, so that the tests can
continue them here. Run once, with the reference venv scripts/estimator_parity.py makes:

    python scripts/make_tf215_fixtures.py --reference_venv=/tmp/tf215-venv

Each case's folder keeps its last checkpoint (the index, the data and the `checkpoint` file), nothing else.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "programs"))
import estimator_parity  # noqa: E402  (the reference venv it makes, and its --reference_venv flag)

flags.DEFINE_string("out", str(ROOT / "tests" / "data" / "tf215"), "Where the cases' folders go.")
FLAGS = flags.FLAGS

# What the reference python runs for one case: train it to STEPS in a model_dir.
TRAIN = """
import sys
sys.path.insert(0, {programs!r})
import tf215_cases
regression, make = tf215_cases.CASES[{case!r}]
make({model_dir!r}).train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS)
"""


def main(argv):
    del argv
    import tf215_cases  # noqa: PLC0415  (imports TensorFlow: only once the flags are read)
    python = estimator_parity.reference_python(pathlib.Path(FLAGS.reference_venv))
    out = pathlib.Path(FLAGS.out)
    for case in tf215_cases.CASES:
        with tempfile.TemporaryDirectory() as work:
            model_dir = pathlib.Path(work) / "model"
            code = TRAIN.format(programs=str(ROOT / "tests" / "programs"), case=case, model_dir=str(model_dir))
            subprocess.run([python, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"})
            target = out / case
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            prefix = f"model.ckpt-{tf215_cases.STEPS}"
            for path in model_dir.glob(prefix + ".*"):
                if not path.name.endswith(".meta"):
                    shutil.copy(path, target / path.name)
            (target / "checkpoint").write_text(
                f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
        print(f"{case}: {sorted(path.name for path in target.iterdir())}", flush=True)


if __name__ == "__main__":
    app.run(main)
