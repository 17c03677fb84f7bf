"""Tasks forked from a preloaded server instead of started as a Python of their own.

A trainer.py task is forked from a server process that has imported trainer.py, and TensorFlow with it,
once (multiprocessing's forkserver): it skips the 3-4 s of CPU that `import tensorflow` costs each
process, which is most of what a short test cluster spends on two cores, and runs trainer.py's main as
`python trainer.py` would. A user's program is forked from a second server that has run `import
tensorflow` alone, as the program's own first line does (no ps_trainer module, no flag, Keras as
TensorFlow loads it), and runs as `python program.py` would. A script that forks its tasks does its own
TensorFlow work in a helper forked the same way (call_with_tensorflow) and never imports TensorFlow itself.
"""

import atexit
import contextlib
import importlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import os
import runpy
import subprocess
import sys
import time
import types

# What a forked task's server imports before it forks: the trainer and TensorFlow; a program's server,
# TensorFlow alone.
PRELOADED_MODULES = ["ps_trainer.trainer"]
PROGRAM_PRELOADED_MODULES = ["tensorflow"]
# Every task's output: unbuffered, as it happens, and no INFO from TensorFlow's C++ side.
TASK_OUTPUT = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}


def _become_task(argv, env, log_path, err_path, cwd, netns=None) -> None:
    """A forked task's start: a session of its own, its log as stdout and stderr (or stderr to a file of
    its own), its environment, directory and command line; with `netns`, that host's network namespace
    (launch/netns.py)."""
    os.setsid()
    for fd, path in ((1, log_path), (2, err_path or log_path)):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    if netns:
        from ps_trainer.launch import netns as hosts  # noqa: PLC0415  (the multi-host tests' alone)
        hosts.enter(netns)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = list(argv)


def _run_trainer_here(argv, env, log_path, err_path, cwd, netns=None) -> None:
    """A forked task's body: trainer.py's main on argv, whose exit code it exits with, as `python
    trainer.py` does."""
    _become_task(argv, env, log_path, err_path, cwd, netns)
    from ps_trainer import trainer  # noqa: PLC0415  (preloaded: already imported)
    trainer.app.run(trainer.main, argv=argv, flags_parser=trainer.parse_flags)


def _run_program_here(argv, env, log_path, err_path, cwd, netns=None) -> None:
    """A forked program's body: the file argv[0] run as __main__ with its folder first on sys.path, its
    uncaught exception or sys.exit() reported and turned into the exit code, the atexit functions run, as
    `python program.py` does."""
    _become_task(argv, env, log_path, err_path, cwd, netns)
    # This module, which the fork imported to find this function: the program imports what it imports.
    for name in [name for name in sys.modules if name == "ps_trainer" or name.startswith("ps_trainer.")]:
        del sys.modules[name]
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B036  (Python's own exit: report whatever ended the program)
        sys.excepthook(*sys.exc_info())
        code = 1
    atexit._run_exitfuncs()  # noqa: SLF001  (what Python runs at exit; os._exit below skips it)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def _main_hidden():
    """multiprocessing runs the starting program's __main__ again in each child, as its own spawn
    method needs. A forked task or helper needs none of it, and a script's top level (a fault drill's
    absl flags) would clash with the trainer's: while it starts one, it is told of a __main__ with
    nothing to run."""
    program = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = program


class HelperTimeout(RuntimeError):
    pass


_helper_pool = None
HELPER_CALL_SECS = 300  # a checkpoint read back whole, on a slow disk; past it the helper is taken for stuck


def call_with_tensorflow(module: str, function: str, *args):
    """module.function(*args), for a module that imports TensorFlow: in this process if it has
    imported TensorFlow already or has forked no task, else in a helper process forked from the
    preloaded server (ForkedTask), which has. A script that forks its tasks (scripts/inject_fault.py)
    then never pays the 3-4 s of CPU of an `import tensorflow` of its own. The helper lives as long as
    this process, in its process group."""
    global _helper_pool
    if "tensorflow" in sys.modules or not ForkedTask._server_started:  # noqa: SLF001  (the class's own flag, read by the module that owns it)
        return _call(module, function, args)
    if _helper_pool is None:
        with _main_hidden():
            _helper_pool = multiprocessing.get_context("forkserver").Pool(1)
        atexit.register(_helper_pool.terminate)
    try:
        return _helper_pool.apply_async(_call, (module, function, args)).get(timeout=HELPER_CALL_SECS)
    except multiprocessing.TimeoutError:
        raise HelperTimeout(f"{module}.{function}({', '.join(map(repr, args))}): no answer from the TensorFlow "
                           f"helper in {HELPER_CALL_SECS} s") from None


def _call(module: str, function: str, args):
    return getattr(importlib.import_module(module), function)(*args)


class ForkedTask:
    """A task forked from the preloaded server, with the part of subprocess.Popen's interface that
    ProcessCluster and its callers use: pid, poll, wait and returncode (negative: killed by that signal).
    program=True: argv[0] is a user's program, forked from the program server (ProgramProcess). netns: the task's
    host, a network namespace (launch/netns.py), which it enters first."""

    stdin = None

    _server_started = False

    def __init__(self, argv, env, log_path, err_path=None, cwd=None, program=False, netns=None):
        context = multiprocessing.get_context("forkserver")
        if not program and not ForkedTask._server_started:
            self._start_server(context)
        process = ProgramProcess if program else context.Process
        self._process = process(target=_run_program_here if program else _run_trainer_here, name=str(argv[0]), args=(
            list(argv), dict(env), str(log_path), err_path and str(err_path), str(cwd or os.getcwd()), netns))
        with _main_hidden():
            self._process.start()
        self.pid = self._process.pid
        # Stopped by its process group's id, which exists once the child's first line has run.
        deadline = time.monotonic() + 30
        while not self._leads_its_group() and self._process.exitcode is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} (pid {self.pid}) did not start a session of its own in 30 s")
            time.sleep(0.005)

    def _leads_its_group(self) -> bool:
        try:
            return os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False

    @staticmethod
    def _start_server(context) -> None:
        """Starts this process's forkserver with the tasks' unbuffered output and TensorFlow log level
        (TASK_OUTPUT): the server reads both as it starts, and the tasks it forks keep what it read."""
        context.set_forkserver_preload(PRELOADED_MODULES)
        own = dict(os.environ)
        os.environ.update(TASK_OUTPUT)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(own)
        ForkedTask._server_started = True

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout)
        return self._process.exitcode


class _ProgramServer(multiprocessing.forkserver.ForkServer):
    """multiprocessing's forkserver, a second one: preloaded with PROGRAM_PRELOADED_MODULES, started
    with the tasks' output settings (TASK_OUTPUT) as the trainer's is."""

    def ensure_running(self):
        if self._forkserver_pid is not None:  # started: ForkServer checks it is alive, and starts it again if not
            super().ensure_running()
            return
        self.set_forkserver_preload(PROGRAM_PRELOADED_MODULES)
        own = dict(os.environ)
        os.environ.update(TASK_OUTPUT)
        try:
            super().ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(own)


_program_server = _ProgramServer()


class _ProgramPopen(multiprocessing.popen_forkserver.Popen):
    """The forkserver's Popen, on the program server: it asks the forkserver module for a new process, which
    the module hands to its own server; while it launches, the module hands it to the program server."""

    def _launch(self, process_obj):
        own = multiprocessing.forkserver.connect_to_new_process
        multiprocessing.forkserver.connect_to_new_process = _program_server.connect_to_new_process
        try:
            super()._launch(process_obj)
        finally:
            multiprocessing.forkserver.connect_to_new_process = own


class ProgramProcess(multiprocessing.context.ForkServerProcess):
    """A multiprocessing Process forked from the program server."""

    @staticmethod
    def _Popen(process_obj):  # multiprocessing's name
        return _ProgramPopen(process_obj)
