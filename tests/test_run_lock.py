"""One run per output folder (issue 57, item 6): a second ``generate``, ``--resume`` or
``--overwrite`` on a folder another process is writing fails at once, exit 2, and changes nothing;
the lock of a process that died does not block; the lock file is never published.

Two runs in one folder mixed their rows under one manifest (``--overwrite``) or voted the same
rounds twice, spending the budget twice and recording it once (``--resume``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fakes import use_fake_backends
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.pipeline.store import LOCK_FILE, PUBLISHED, CheckpointError, RunStore

ROOT = Path(__file__).resolve().parents[1]
#: A second process that takes the folder's lock the way a run does, and holds it until told.
HOLDER = """
import sys
from wasp_vllm.pipeline.store import RunStore
store = RunStore(sys.argv[1])  # held while the store lives
store.prepare(resume=True, overwrite=False)
print("locked", flush=True)
sys.stdin.readline()
"""


def _generate(private: Path, out: Path, *extra: str):
    argv = ["generate", "--plms", "a", "--private", str(private), "--n", "12", "--rounds", "2", "--q", "2",
            "--s", "2", "--out", str(out), "--noise-seed", "1", *extra]  # fmt: skip
    return CliRunner().invoke(app, argv)


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time (a rewrite with the same bytes shows too)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _hold(out: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_busy_folder_refuses_a_second_run_and_changes_nothing(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    private, out = write_private(tmp_path / "private.csv", n=12), tmp_path / "run"
    first = _generate(private, out)
    assert first.exit_code == 0, first.output
    before = _snapshot(out)
    holder = _hold(out)
    try:
        for extra in ((), ("--resume",), ("--overwrite",)):
            busy = _generate(private, out, *extra)
            assert busy.exit_code == 2, (extra, busy.output)
            assert "busy" in busy.output and "another wasp-vllm run" in busy.output
            assert _snapshot(out) == before, extra
    finally:
        holder.kill()  # SIGKILL: the lock it leaves must not block the next run
        holder.wait()
    again = _generate(private, out, "--overwrite")
    assert again.exit_code == 0, again.output


def test_the_lock_is_per_process_and_released_with_the_run(tmp_path):
    store, second = RunStore(tmp_path / "run"), RunStore(tmp_path / "run")
    store.prepare(resume=False, overwrite=False)
    with pytest.raises(CheckpointError, match="busy"):
        second.prepare(resume=True, overwrite=False)
    with pytest.raises(CheckpointError, match="busy"):
        second.check(resume=True, overwrite=False)
    store.unlock()
    second.prepare(resume=True, overwrite=False)
    second.unlock()


def test_the_lock_file_is_not_published(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    out = tmp_path / "run"
    assert _generate(write_private(tmp_path / "private.csv", n=12), out).exit_code == 0
    assert (out / LOCK_FILE).exists() and LOCK_FILE not in PUBLISHED
    shared = CliRunner().invoke(app, ["publish", str(out), str(tmp_path / "shared"), "--allow-void-epsilon"])
    assert shared.exit_code == 0, shared.output
    assert not (tmp_path / "shared" / LOCK_FILE).exists()


def test_a_store_that_is_dropped_lets_the_folder_go(tmp_path):
    """Hot PATE's command prepares a store and never unlocks it: dropping it frees the folder."""
    store = RunStore(tmp_path / "run")
    store.prepare(resume=False, overwrite=False)
    del store
    RunStore(tmp_path / "run").prepare(resume=True, overwrite=False)


def test_a_prepared_block_lets_the_folder_go_however_it_ends(tmp_path):
    """Hot PATE's command and Run.execute hold the folder for a block: while it runs a second run is
    refused, after it (even one ended by an error) the folder is free."""
    store = RunStore(tmp_path / "run")
    with pytest.raises(RuntimeError, match="the run failed"), store.prepared(resume=False, overwrite=False):
        with pytest.raises(CheckpointError, match="is busy"):
            RunStore(tmp_path / "run").prepare(resume=True, overwrite=False)
        raise RuntimeError("the run failed")
    second = RunStore(tmp_path / "run")
    second.prepare(resume=True, overwrite=False)
    second.unlock()
    assert store._lock is None  # released by the block, not left to the store's end
