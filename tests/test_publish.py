"""The data set's card, ``wasp-vllm publish`` and ``--push-to-hub``.

Every run writes ``README.md`` (a Hugging Face data set card) beside ``synthetic.parquet``;
``publish`` gathers the shareable files and the card in a folder that ``datasets.load_dataset``
reads, never ``private/``, atomically, refusing a void epsilon unless told; the push goes through
``huggingface_hub`` to a local stand-in of the hub (no hub is reachable here) that implements the
three calls a data set upload makes: create the repo, ask each file's upload mode, commit."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

import wasp_vllm
from tests.fakes import use_fake_backends
from wasp_vllm.cli import app
from wasp_vllm.publish import PublishError, publish_run, push_to_hub

SMALL: dict[str, Any] = dict(plms=["a", "b"], n=36, rounds=3, q=2, s=2)
SHAREABLE = {"synthetic.parquet", "manifest.json", "README.md"}


@pytest.fixture
def run(tmp_path, monkeypatch) -> Path:
    use_fake_backends(monkeypatch)
    monkeypatch.setenv("WASP_VLLM_CACHE", str(tmp_path / "cache"))
    return wasp_vllm.generate(**SMALL, out=tmp_path / "run").out


def card_parts(path: Path) -> tuple[dict, str]:
    text = path.read_text()
    assert text.startswith("---\n")
    _, header, body = text.split("---\n", 2)
    return yaml.safe_load(header), body


def test_every_run_writes_a_card_a_reader_can_use(run):
    header, body = card_parts(run / "README.md")
    assert header["license"] == "other" and header["task_categories"] == ["text-classification"]
    assert header["size_categories"] == ["n<1K"] and header["language"] == ["en"]
    assert {"synthetic", "differential-privacy", "wasp"} <= set(header["tags"])
    assert header["configs"][0]["data_files"] == [{"split": "train", "path": "synthetic.parquet"}]
    manifest = json.loads((run / "manifest.json").read_text())
    spent = manifest["privacy"]["ledger"]["epsilon_spent"]
    flat = " ".join(body.split())
    assert f"This data set is ({spent:.3g}, 1e-05)-differentially private" in flat
    assert "any one record was added or removed" in flat and "the privacy unit is one record" in flat
    assert "## What this data must not be used for" in body and "Not real data" in body
    labels = pq.read_table(run / "synthetic.parquet").column("label").to_pylist()
    for label in ("positive", "neutral", "negative"):
        assert f"| {label} | {labels.count(label)} |" in body  # counts of the synthetic output
    assert 'load_dataset("' in body and "wasp" in body and "| a |" in body


def test_a_void_epsilon_card_says_there_is_no_guarantee(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    out = wasp_vllm.generate(**SMALL, noise_seed=5, license="cc-by-4.0", out=tmp_path / "void").out
    header, body = card_parts(out / "README.md")
    assert header["license"] == "cc-by-4.0"
    assert "There is no privacy guarantee" in body and "differentially private:" not in body


def test_publish_writes_only_the_shareable_files_and_datasets_loads_them(run, tmp_path):
    dest = tmp_path / "published"
    files = publish_run(run, dest)
    assert {p.name for p in files} == SHAREABLE == {p.name for p in dest.iterdir()}
    assert (dest / "synthetic.parquet").read_bytes() == (run / "synthetic.parquet").read_bytes()
    import datasets

    loaded = datasets.load_dataset(str(dest), split="train")
    assert loaded.num_rows == 36 and {"text", "label", "plm"} <= set(loaded.column_names)
    assert not list(tmp_path.glob(".published.*"))  # no staging folder left behind


def test_publish_refuses_what_it_must_and_loses_nothing(run, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    cli = CliRunner()
    refused = cli.invoke(app, ["publish", str(run), str(dest)])
    assert refused.exit_code == 2 and "--overwrite" in refused.output
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]  # untouched
    done = cli.invoke(app, ["publish", str(run), str(dest), "--overwrite", "--license", "mit"])
    assert done.exit_code == 0, done.output
    assert {p.name for p in dest.iterdir()} == SHAREABLE
    assert card_parts(dest / "README.md")[0]["license"] == "mit"
    bad = cli.invoke(app, ["publish", str(run), str(tmp_path / "x"), "--license", "CC BY"])
    assert bad.exit_code == 2 and "license" in bad.output and not (tmp_path / "x").exists()
    inside = cli.invoke(app, ["publish", str(run), str(run / "private" / "pub")])
    assert inside.exit_code == 2 and "choose another folder" in inside.output
    (run / "synthetic.parquet").write_bytes(b"not the run's file")
    with pytest.raises(PublishError, match="sha256"):
        publish_run(run, tmp_path / "tampered")
    assert cli.invoke(app, ["publish", str(tmp_path / "nothing"), str(tmp_path / "y")]).exit_code == 2


def test_a_void_epsilon_is_published_only_when_asked(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    out = wasp_vllm.generate(**SMALL, noise_seed=5, out=tmp_path / "void").out
    cli = CliRunner()
    refused = cli.invoke(app, ["publish", str(out), str(tmp_path / "pub")])
    assert refused.exit_code == 2 and "--allow-void-epsilon" in refused.output
    assert not (tmp_path / "pub").exists()
    allowed = cli.invoke(app, ["publish", str(out), str(tmp_path / "pub"), "--allow-void-epsilon"])
    assert allowed.exit_code == 0 and "no privacy guarantee" in allowed.output


class HubStandIn(BaseHTTPRequestHandler):
    """The Hub's endpoints a data set upload calls: create the repo, validate the card's YAML header,
    pre-upload (every file goes as a regular git blob here: no LFS or Xet storage to stand in for),
    commit.  Records what it got."""

    repos: dict[str, dict] = {}
    validated: list[dict] = []
    refuse_create = False

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:3] == ["api", "repos", "create"]:
            if self.refuse_create:
                return self._json(403, {"error": "You don't have the rights to create this dataset"})
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}"
            self.repos.setdefault(repo, {"type": req.get("type"), "files": {}})
            return self._json(200, {"url": f"http://{self.headers['Host']}/datasets/{repo}"})
        if parts[:2] == ["api", "validate-yaml"]:  # the client checks README.md's header first
            content = json.loads(body)["content"]
            meta = yaml.safe_load(content.split("---\n")[1]) if content.startswith("---\n") else None
            if not isinstance(meta, dict) or "license" not in meta:
                return self._json(400, {"errors": [{"message": "no YAML metadata with a license"}]})
            self.validated.append(meta)
            return self._json(200, {"warnings": []})
        if parts[:2] == ["api", "datasets"] and parts[4] == "preupload":
            files = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return self._json(200, {"files": modes})
        if parts[:2] == ["api", "datasets"] and parts[4] == "commit":
            repo = "/".join(parts[2:4])
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    content = base64.b64decode(item["value"]["content"])
                    self.repos[repo]["files"][item["value"]["path"]] = content
            return self._json(200, {"commitUrl": f"http://{self.headers['Host']}/datasets/{repo}/commit/1",
                                    "commitOid": "1" * 40})  # fmt: skip
        return self._json(404, {"error": "not found"})

    def do_GET(self) -> None:  # noqa: N802
        self._json(404, {"error": "Repository not found"})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hub():
    HubStandIn.repos, HubStandIn.validated, HubStandIn.refuse_create = {}, [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_push_to_hub_uploads_the_published_folder(run, tmp_path, hub, monkeypatch):
    import huggingface_hub.constants

    # Offline, as the command line makes it (read at import): the push lifts it for its own requests.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    dest = tmp_path / "pub"
    result = CliRunner().invoke(
        app, ["publish", str(run), str(dest), "--push-to-hub", "me/wasp-drugs", "--endpoint", hub]
    )
    assert result.exit_code == 0, result.output
    repo = HubStandIn.repos["me/wasp-drugs"]
    assert repo["type"] == "dataset"
    assert repo["files"] == {p.name: p.read_bytes() for p in dest.iterdir()}
    assert set(repo["files"]) == SHAREABLE and "pushed to" in result.output
    assert HubStandIn.validated and HubStandIn.validated[0]["license"] == "other"
    assert huggingface_hub.constants.HF_HUB_OFFLINE  # and restores it


def test_a_refused_push_is_one_clear_error(run, tmp_path, hub):
    HubStandIn.refuse_create = True
    with pytest.raises(PublishError, match="push to .* failed"):
        push_to_hub(publish_run(run, tmp_path / "pub")[0].parent, "me/data", endpoint=hub)
    with pytest.raises(PublishError, match="OWNER/NAME"):
        push_to_hub(tmp_path / "pub", "no-owner", endpoint=hub)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"q": 8}, "Top-Q=8 nearest and furthest synthetic samples of its label"),
        ({"q": 8, "far_votes": "off"}, "Top-Q=8 nearest synthetic samples of its label"),
    ],
)
def test_the_card_says_what_each_record_voted_for(config, says):
    from wasp_vllm.pipeline.card import _about

    assert says in _about({"config": {"plms": ["a"], "rounds": 5, **config}}, "")
