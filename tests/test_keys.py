"""The run's noise key and the owner's key: deleted when no longer needed, refused when exposed.

With a run's noise key, anyone holding its published noisy values could subtract the noise (the
label shares would give back the exact private label proportions), so a finished run deletes it
and re-finishes from its checkpoints alone.  A key file that group or others may read is refused
when it is read, as ssh refuses such a private key.  Generation comes from
``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests`` (named as such).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.fakes import use_fake_backends
from tests.test_noise import DiesInRound1, FakeEngineForUnitTests, Killed, config, run, write_private
from wasp_vllm.cli import app
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.secrets import KeyFileError, owner_key


def test_a_finished_run_deletes_its_noise_key_and_refinishes_without_it(tmp_path):
    cfg = config(write_private(tmp_path / "p.csv"))
    out = tmp_path / "out"
    run(cfg, out)
    store = RunStore(out)
    assert store.load_state().noise_key_check is not None  # the run voted with a secret key
    assert not store.key_path.exists()
    published = {name: (out / name).read_bytes() for name in ("synthetic.parquet", "manifest.json")}
    for name in published:  # as a kill while the final files were written would leave it
        (out / name).unlink()
    run(cfg, out, resume=True)
    assert (out / "synthetic.parquet").read_bytes() == published["synthetic.parquet"]
    assert not store.key_path.exists()
    run(cfg, out, resume=True)  # everything in place: written again, still without a key
    assert (out / "synthetic.parquet").read_bytes() == published["synthetic.parquet"]


def test_an_unfinished_run_keeps_its_key_until_it_finishes(tmp_path):
    cfg = config(write_private(tmp_path / "p.csv"))
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(cfg, out, {"a": DiesInRound1("a"), "b": FakeEngineForUnitTests("b")})
    assert RunStore(out).key_path.exists()  # the rounds to come need it
    run(cfg, out, resume=True)
    assert not RunStore(out).key_path.exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660], ids=["640", "604", "660"])
def test_a_noise_key_open_to_others_is_refused_through_the_cli(tmp_path, monkeypatch, mode):
    private = write_private(tmp_path / "p.csv")
    cfg = config(private, private_limit=100)  # the settings of the command line below
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(cfg, out, {"a": DiesInRound1("a"), "b": FakeEngineForUnitTests("b")})
    key = RunStore(out).key_path
    key.chmod(mode)
    use_fake_backends(monkeypatch)
    argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "90", "--rounds", "3",
            "--q", "2", "--s", "2", "--out", str(out), "--resume"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert f"noise key is accessible to other users (mode {mode:03o})" in line and "chmod 600" in line
    assert key.read_text().strip() not in line  # the message names no secret
    key.chmod(0o600)
    result = CliRunner().invoke(app, argv)  # restricted again: the run goes on and finishes
    assert result.exit_code == 0, result.output
    assert not key.exists()


def test_an_owner_key_open_to_others_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("WASP_VLLM_HOME", str(tmp_path / "home"))
    first = owner_key()  # made with mode 0600
    path = tmp_path / "home" / "owner.key"
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"owner key is accessible to other users \(mode 644\)") as err:
        owner_key()
    assert first.hex() not in str(err.value)
    path.chmod(0o600)
    assert owner_key() == first


def test_the_cli_refuses_a_run_when_the_owner_key_is_open_to_others(tmp_path, monkeypatch):
    monkeypatch.setenv("WASP_VLLM_HOME", str(tmp_path / "home"))
    owner_key()
    (tmp_path / "home" / "owner.key").chmod(0o664)
    use_fake_backends(monkeypatch)
    private = write_private(tmp_path / "p.csv")
    argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "90", "--rounds", "3",
            "--q", "2", "--s", "2", "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "owner key is accessible to other users (mode 664)" in " ".join(result.output.split())
