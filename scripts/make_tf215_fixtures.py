#!/usr/bin/env python3
"""Writes tests/data/tf215/: checkpoints the real Estimator (TensorFlow 2.15.1, tensorflow-estimator 2.15.0)
wrote for each case of tests/programs/tf215_cases.py, trained tf215_cases.STEPS steps, the signatures of the
SavedModel it exported from them and their evaluation, so that the tests can continue and export them here. Run
once, with the reference venv scripts/estimator_parity.py makes:

    python scripts/make_tf215_fixtures.py --reference_venv=/tmp/tf215-venv [--cases=NAME,...]

Each case's folder keeps its last checkpoint (the index, the data and the `checkpoint` file),
`signatures.json` (each signature's method and input and output keys) and `metrics.json` (what `evaluate`
returned for that checkpoint over the cases' data), nothing else.
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
flags.DEFINE_list("cases", None, "The cases to write (default: every case of tf215_cases.CASES).")
FLAGS = flags.FLAGS

# What the reference python runs for one case: train it to STEPS in a model_dir.
TRAIN = """
import sys
sys.path.insert(0, {programs!r})
import tf215_cases
regression, make = tf215_cases.CASES[{case!r}]
estimator = make({model_dir!r})
estimator.train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS)
exported = estimator.export_saved_model({export_base!r}, tf215_cases.serving_input_receiver_fn)
tf215_cases.write_signatures(exported.decode(), {signatures!r})
tf215_cases.write_metrics(estimator.evaluate(tf215_cases.input_fn(regression, epochs=1)), {metrics!r})
"""


def main(argv):
    del argv
    import tf215_cases  # noqa: PLC0415  (imports TensorFlow: only once the flags are read)
    python = estimator_parity.reference_python(pathlib.Path(FLAGS.reference_venv))
    out = pathlib.Path(FLAGS.out)
    for case in FLAGS.cases or tf215_cases.CASES:
        with tempfile.TemporaryDirectory() as work:
            model_dir = pathlib.Path(work) / "model"
            target = out / case
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            code = TRAIN.format(programs=str(ROOT / "tests" / "programs"), case=case, model_dir=str(model_dir),
                                export_base=str(pathlib.Path(work) / "export"),
                                signatures=str(target / "signatures.json"), metrics=str(target / "metrics.json"))
            subprocess.run([python, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"})
            prefix = f"model.ckpt-{tf215_cases.STEPS}"
            for path in model_dir.glob(prefix + ".*"):
                if not path.name.endswith(".meta"):
                    shutil.copy(path, target / path.name)
            (target / "checkpoint").write_text(
                f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
        print(f"{case}: {sorted(path.name for path in target.iterdir())}", flush=True)


if __name__ == "__main__":
    app.run(main)
