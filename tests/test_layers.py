"""The packages import only down the layers: the tooling (launch/) is never reached from the trainer,
and the core (cluster/, model/, input/) knows nothing of training, flags or launchers."""

import ast

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.pure

# Each may import its own layer and the ones below.
LAYER = {"cluster": 0, "model": 0, "input": 0, "training": 1, "flags": 2, "trainer": 3, "launch": 4}


def imported_packages(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_no_import_points_up_the_layers():
    upward = []
    for package, layer in LAYER.items():
        files = [ROOT / "trainer.py"] if package == "trainer" else sorted((ROOT / package).glob("*.py"))
        assert files, package
        for path in files:
            upward += [f"{path.relative_to(ROOT)} imports {name}" for name in imported_packages(path)
                       if LAYER.get(name, -1) > layer]
    assert upward == []
