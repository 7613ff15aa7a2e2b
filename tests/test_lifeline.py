"""Issue 60, item 6: nothing is left behind when a run ends, however it ends.

The watchdog of ``engines/lifeline.py`` runs in every vLLM engine-core process: once the process
that started it is gone, it kills its own descendants and exits.  The first tests use real
processes (a parent killed with SIGKILL, the way ``kill -9`` ends a run) and a plain Python child
in the engine core's place; the slow one kills a real vLLM run and looks for its engine core.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A parent that starts a child (and the child a grandchild), prints their pids, and waits to be killed.
PARENT = textwrap.dedent(
    """
    import json, multiprocessing, os, subprocess, sys, time
    from wasp_vllm.engines import lifeline

    def core(queue, watched):
        if watched:
            lifeline.start_watchdog(os.getppid())
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        queue.put((os.getpid(), worker.pid))
        time.sleep(600)  # like an engine core waiting for a front end that never asks again

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(sys.argv[1])
        queue = ctx.Queue()
        ctx.Process(target=core, args=(queue, sys.argv[2] == "watched")).start()
        print(json.dumps(queue.get(timeout=60)), flush=True)
        time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start(tmp_path: Path, method: str, watched: str) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(script), method, watched]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None
    return parent, json.loads(parent.stdout.readline())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_watched_child_ends_with_its_killed_parent(tmp_path, method):
    parent, pids = _start(tmp_path, method, "watched")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "the child or its worker outlived the killed parent"


def test_an_unwatched_child_outlives_its_killed_parent(tmp_path):
    """The control: without the watchdog the child stays (what the issue saw of vLLM's core)."""
    parent, pids = _start(tmp_path, "fork", "unwatched")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    time.sleep(2)
    try:
        assert all(_alive(p) for p in pids)
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_install_replaces_the_engine_core_target_once():
    """From vLLM's own target (whether or not an earlier engine in this process installed the
    watch), installing twice wraps it once; the process's state is restored after."""
    pytest.importorskip("vllm")
    from vllm.v1.engine.core import EngineCoreProc

    from wasp_vllm.engines import lifeline

    saved, saved_original = EngineCoreProc.__dict__["run_engine_core"], lifeline._original
    pristine = saved_original or saved.__func__  # vLLM's own target
    try:
        EngineCoreProc.run_engine_core = staticmethod(pristine)
        lifeline._original = None
        lifeline.install()
        lifeline.install()
        assert EngineCoreProc.run_engine_core is lifeline.run_engine_core_watched
        assert lifeline._original is pristine  # not the wrapper: no recursion
    finally:
        EngineCoreProc.run_engine_core = saved
        lifeline._original = saved_original


def _engine_cores(run: psutil.Process) -> list[psutil.Process]:
    found = []
    for proc in run.children(recursive=True):
        try:
            if "EngineCore" in " ".join(proc.cmdline()) or "EngineCore" in proc.name():
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_real_vllm_run_killed_with_sigkill_leaves_no_engine_process(tmp_path):
    """``kill -9`` of a real run on the vLLM engine: within 15 s none of its processes is alive.  The run
    starts its engine core as a process of its own, as on a GPU (on a small CPU it would keep it in
    its own process, and there would be nothing to leave behind)."""
    pytest.importorskip("vllm")
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    argv = [sys.executable, "-m", "wasp_vllm", "generate", "--plms", "smollm2", "--engine", "vllm",
            "--task", "drugs", "--private", "drugs:fit", "--n", "300", "--rounds", "2", "--s", "2",
            "--max-new-tokens", "16", "--out", str(tmp_path / "run")]  # fmt: skip
    run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, cores = time.monotonic() + 600, []
        while not cores and run.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
            cores = _engine_cores(psutil.Process(run.pid))
        assert cores, "the run ended or timed out before its engine core started"
        left = psutil.Process(run.pid).children(recursive=True)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 15  # polled: the test ends as soon as the last one is gone
        while any(_alive(p.pid) for p in left) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = [p.pid for p in left if _alive(p.pid)]
        assert not alive, f"processes of the killed run still alive: {alive}"
    finally:
        if run.poll() is None:
            run.kill()


def test_sigterm_ends_the_command_through_its_finally_blocks_and_the_handler_is_restored():
    from wasp_vllm.cli.app import _sigterm_exits

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit) as stopped, _sigterm_exits():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        finally:
            cleaned.append(True)  # where a run closes its engines
    assert stopped.value.code == 128 + signal.SIGTERM and cleaned
    assert signal.getsignal(signal.SIGTERM) == before
