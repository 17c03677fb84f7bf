"""ps-trainer's namespace: `ps_trainer.estimator` runs TF1 Estimator programs on the trainer's parameter-server
runtime; `ps_trainer.trainer` is the trainer's main; `ps_trainer.model`, `.input`, `.flags`, `.training`,
`.cluster` and `.launch` are its parts. Nothing else lands on a program's import path, so a program's own
`model.py`, `flags.py`, `input.py` or `trainer/` beside it is its own.

Installed, the parts are subpackages here (setup.cfg's package_dir); in a checkout they are the
top-level folders beside this one (model/, input/, flags/, ...), which this package's path takes in."""

import pathlib

_CHECKOUT = pathlib.Path(__file__).resolve().parent.parent
if (_CHECKOUT / "trainer.py").is_file() and (_CHECKOUT / "model" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821  (a package's own __path__)
