"""The installed project is ps_trainer.* only (setup.cfg, ps_trainer/__init__.py): every package folder of
the checkout is installed under it, and no module imports a part by a bare name, which would load a second
copy of it (its flags defined twice, its registries apart) and, installed, fail."""

import configparser
import os
import pathlib
import re

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.pure

PARTS = ("flags", "model", "input", "cluster", "training", "launch")
BARE_IMPORT = re.compile(rf"^\s*(?:from|import) (?:{'|'.join(PARTS)}|trainer)\b", re.M)


def test_setup_cfg_installs_every_package_folder_under_ps_trainer_and_nothing_else():
    options = configparser.ConfigParser()
    options.read(ROOT / "setup.cfg")
    packages = options["options"]["packages"].split()
    folders = dict(line.split(" = ") for line in options["options"]["package_dir"].strip().splitlines())
    found = {"ps_trainer." + str(init.parent.relative_to(ROOT)).replace("/", ".")
             for part in PARTS for init in (ROOT / part).rglob("__init__.py")}
    found |= {str(init.parent.relative_to(ROOT)).replace("/", ".")
              for init in (ROOT / "ps_trainer").rglob("__init__.py")}
    assert sorted(packages) == sorted(found)
    assert all(package.startswith("ps_trainer") for package in packages)
    for package in packages:  # each folder named where it is in the checkout
        folder = folders.get(package) or folders[package.rsplit(".", 1)[0]] + "/" + package.rsplit(".", 1)[1]
        assert (ROOT / folder / "__init__.py").is_file(), package
    assert "py_modules" not in options["options"]


def test_no_module_imports_a_part_of_the_project_by_a_bare_name():
    sources = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in ("runs", "programs")]
        sources += [pathlib.Path(folder) / name for name in files if name.endswith(".py")]
    assert len(sources) > 100
    bare = [f"{path.relative_to(ROOT)}: {found.group(0).strip()}" for path in sources
            for found in BARE_IMPORT.finditer(path.read_text())]
    assert not bare, bare
