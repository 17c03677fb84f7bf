"""Fixtures: real local clusters that always stop. Shared helpers are in tests/support.py.

Every test says its tier with exactly one marker (setup.cfg lists them): pure, inprocess, servers or
e2e. The fast loop for everyday work is `pytest -m "pure or inprocess"`.
"""

import contextlib
import os
import socket
import subprocess

import pytest

from ps_trainer.tf_loading import keras_hidden

TIERS = ("pure", "inprocess", "servers", "e2e")
# The order tests start in: the longest first, so that with two processes (pytest -n 2) they end
# together on short tests instead of one waiting on a drill started last.
START_ORDER = ("drill", "e2e", "servers", "inprocess", "pure")


def pytest_collection_modifyitems(items):
    wrong = [f"{item.nodeid}: {tiers or 'none'}" for item in items
             if len(tiers := sorted({m.name for m in item.iter_markers() if m.name in TIERS})) != 1]
    if wrong:
        raise pytest.UsageError("every test needs exactly one tier marker (" + ", ".join(TIERS) + "):\n  "
                                + "\n  ".join(wrong))
    items.sort(key=lambda item: next(i for i, name in enumerate(START_ORDER) if item.get_closest_marker(name)))


def pytest_configure(config):
    """A process that runs tests loads TensorFlow as a trainer task does, without the Keras it loads eagerly
    (each saves the seconds Keras costs); pytest-xdist's controller runs none and loads none.

    --dist=loadgroup sends the tests of one xdist_group to one test process (the Slurm tests: one
    real Slurm at a time). pytest-xdist 3.8 tells its scheduler a test's group by rewriting its node id,
    which pytest 9.2 no longer lets it do: the groups are ignored without a word
    (pytest-dev/pytest-xdist#1386). setup.cfg's test extra holds pytest below 9.2; under a newer one
    the run stops here, saying so."""
    if config.getoption("dist", None) == "loadgroup" and not hasattr(config, "workerinput"):
        if tuple(int(part) for part in pytest.__version__.split(".")[:2]) >= (9, 2):
            raise pytest.UsageError(f"pytest {pytest.__version__}: pytest-xdist's --dist=loadgroup ignores every "
                                    "xdist_group under it (pytest-dev/pytest-xdist#1386); install the test "
                                    "extra's pytest: pip install -e '.[test]'")
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        with keras_hidden():
            import tensorflow  # noqa: F401, PLC0415  (before any test module imports it: see above)


@pytest.fixture(autouse=True)
def pure_tests_stay_pure(request, monkeypatch):
    """A pure test looks no name up and starts no process: each fails it, naming what it did."""
    if request.node.get_closest_marker("pure") is None:
        return

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"a pure test may not {what}: give it a fake, or mark the test inprocess or e2e")
        return refused

    monkeypatch.setattr(socket, "getaddrinfo", refuse("look a name up (socket.getaddrinfo)"))
    monkeypatch.setattr(socket, "gethostbyname", refuse("look a name up (socket.gethostbyname)"))
    monkeypatch.setattr(subprocess, "Popen", refuse("start a process (subprocess.Popen)"))


@pytest.fixture(autouse=True)
def inprocess_tests_start_no_server(request, monkeypatch):
    """An inprocess test starts no gRPC server (tf.test.create_local_cluster's included): one that does
    fails, naming it, and belongs to the servers tier, outside the fast loop."""
    if request.node.get_closest_marker("inprocess") is None:
        return
    from tensorflow.python.training import server_lib

    def refused(*args, **kwargs):
        raise AssertionError("an inprocess test may not start a gRPC server (tf.distribute.Server, "
                             "tf.test.create_local_cluster): mark the test servers")
    monkeypatch.setattr(server_lib.Server, "__init__", refused)


@pytest.fixture(autouse=True, scope="session")
def ports_of_this_test_process():
    """Under pytest-xdist, each test process picks its clusters' ports from a slice of its own of
    launch.processes.PORT_RANGE, and so do the launchers it starts (scripts/run_local.py, inject_fault.py),
    which inherit it as PS_TRAINER_PORTS: two processes never hand out the same port."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    from ps_trainer.launch import processes
    whole, index = processes.PORT_RANGE, int(worker.removeprefix("gw"))
    size = len(whole) // int(count)
    os.environ[processes.PORTS_VARIABLE] = f"{whole.start + index * size}-{whole.start + (index + 1) * size - 1}"


@contextlib.contextmanager
def cluster_factory(directory):
    """Makes LocalClusters under `directory`; every one is stopped on leaving, whatever happened."""
    # Imported here: pytest-xdist's controller loads this file too, and needs no TensorFlow.
    from ps_trainer.launch.processes import LocalCluster
    from tests.support import FAST_ARGS
    clusters = []

    def make(num_ps=1, num_workers=2, trainer_args=(), name="run", preload=True, **options):
        model_dir = directory / name / "model"
        args = [f"--model_dir={model_dir}", *FAST_ARGS, *trainer_args]
        cluster = LocalCluster(directory / name, num_ps, num_workers, args, preload=preload, **options)
        cluster.model_dir = model_dir
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop_all(grace_secs=5)


@pytest.fixture
def make_cluster(tmp_path):
    """Factory of LocalClusters under tmp_path; every one is stopped at teardown, whatever happened."""
    with cluster_factory(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def make_module_cluster(tmp_path_factory, request):
    """make_cluster for a cluster that several tests of one module read (its tests share an xdist_group, so
    one process runs them all, and the cluster once)."""
    with cluster_factory(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])) as make:
        yield make
