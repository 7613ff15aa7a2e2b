"""``wasp-vllm report``: the HTML page of a real run directory, checked as text and in a real browser.

The run is a real ``Run(prepare(cfg), out, ...)`` whose generation comes from
``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests`` (named as such): the subject
is the report, not the engines.  The page is then opened in the system's headless Chromium
(``/usr/bin/chromium``, driven by the ``playwright`` package, never its downloaded browsers): no
console error, no page error, every image loaded, a full-page screenshot.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import leaks, private_texts
from wasp_vllm.cli import app
from wasp_vllm.config import RunConfig
from wasp_vllm.pipeline import Run, prepare

LABELS = ["positive", "neutral", "negative"]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def make_run(tmp: Path, n: int = 60, rounds: int = 3, **kw: Any) -> tuple[Path, Path, list[str]]:
    """A finished run on the fake engine: (run directory, private CSV, the private texts)."""
    texts = private_texts(45, seed=5)
    private = tmp / "private.csv"
    private.write_text("text,label\n" + "".join(f"{t},{LABELS[i % 3]}\n" for i, t in enumerate(texts)))
    settings: dict[str, Any] = dict(plms=["a", "b"], task="drugs", private=str(private), n=n, rounds=rounds,
                                    q=2, s=2, engine_args={"concurrent": False}) | kw  # fmt: skip
    engines: dict[str, FakeEngineForUnitTests] = {}

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return engines.setdefault(name, FakeEngineForUnitTests(name))

    out = tmp / "run"
    Run(
        prepare(RunConfig(**settings)), out, engine_factory=factory, embedder=HashEmbedderForTests()
    ).execute()
    return out, private, texts


def invoke(*argv: str) -> str:
    result = CliRunner().invoke(app, ["report", *argv])
    assert result.exit_code == 0, result.output
    return result.output


def sections(html: str) -> list[str]:
    return re.findall(r'<section id="([a-z]+)"', html)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    return make_run(tmp_path_factory.mktemp("report"), label_prior="private")  # every release shown


def test_the_page_shows_rounds_labels_privacy_and_samples(run):
    out, _, texts = run
    invoke(str(out))
    page = out / "report" / "index.html"
    html = page.read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert sections(html) == ["privacy", "rounds", "labels", "rejects", "work", "samples", "sharing"]
    ledger, plan = manifest["privacy"]["ledger"], manifest["privacy"]["plan"]
    assert plan["prior_sigma"] is not None  # this run pays for a label prior too
    for value in (ledger["epsilon_spent"], plan["sigma"], plan["sensitivity"], plan["prior_sigma"]):
        assert f"{value:.4g}" in html
    assert "1e-05" in html and ">exact<" in html  # delta and the accountant
    assert "ε VOID" not in html  # the noise came from the run's secret key
    for record in manifest["rounds"]:  # quotas, kept and weights of every round and PLM
        for i, plm in enumerate(manifest["config"]["plms"]):
            assert f"{record['weights_before'][i]:.4g}" in html
            assert f'<td class="n">{record["quotas"][plm]}</td>' in html
    gated = any("rejects" in r for r in manifest["rounds"])  # runs before the quality gate have none
    assert ("No quality gate in this run." in html) is not gated
    for name in ("weights.png", "labels.png"):
        assert f'src="{name}"' in html and (page.parent / name).stat().st_size > 5000
    assert "Publishable" in html and "<code>private/</code>" in html and "<code>manifest.json</code>" in html
    assert "OPERATOR ONLY" not in html and not (page.parent / "fid.png").exists()
    assert not leaks(html, texts)  # the publishable page holds none of the private records
    assert not re.search(r'(src|href)="(https?:)?//', html)  # loads nothing from the network


def test_samples_are_escaped_and_labels_counted(run, tmp_path):
    out = shutil.copytree(run[0], tmp_path / "run")
    table = pq.read_table(out / "synthetic.parquet")
    texts = table.column("text").to_pylist()
    last = max(range(len(texts)), key=lambda i: table.column("round")[i].as_py())  # shown: latest round
    texts[last] = "<script>alert(1)</script> <b>bold</b>"
    table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
    pq.write_table(table, out / "synthetic.parquet")
    invoke(str(out))
    html = (out / "report" / "index.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "<script" not in html and "<b>" not in html
    assert "&quot; and more" in html  # the fake engine's samples end in a double quote
    totals = re.search(r'<tr class="total"><td>all</td>((?:<td class="n">\d+</td>)+)</tr>', html)
    assert totals is not None
    counts = [int(x) for x in re.findall(r"\d+", totals.group(1))]
    assert counts[-1] == json.loads((out / "manifest.json").read_text())["output"]["rows"] == sum(counts[:-1])


def test_with_private_data_the_report_is_the_operators(run, monkeypatch):
    out, private, _ = run
    monkeypatch.setattr("wasp_vllm.engines.embedder.Embedder", HashEmbedderForTests)  # the run's own embedder
    said = invoke(str(out), "--private", str(private))
    page = out / "private" / "report" / "index.html"  # beside the other files the operator keeps
    html = page.read_text()
    assert "do not share it" in " ".join(said.split())
    assert sections(html)[-2:] == ["fid", "sharing"]
    assert "OPERATOR ONLY: DO NOT SHARE THIS REPORT" in html and "Publishable" not in html
    assert "NEVER to be published" in html and "Not this report." in html
    fid_rows = re.findall(r'<tr><td class="n">(\d)</td><td class="n">([\d.e+-]+)</td></tr>', html)
    assert [int(t) for t, _ in fid_rows] == [0, 1, 2] and all(float(v) > 0 for _, v in fid_rows)
    assert (page.parent / "fid.png").stat().st_size > 5000
    # the same folder rendered again without --private loses the operator's figure
    invoke(str(out), "--out", str(page.parent))
    assert not (page.parent / "fid.png").exists() and "OPERATOR ONLY" not in page.read_text()


def test_void_epsilon_and_rejects_are_shown(tmp_path):
    out, _, _ = make_run(tmp_path, n=24, rounds=2, noise_seed=7)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["rounds"][0]["rejects"] = {"a": {"echo": 3, "too_short": 1}, "b": {"echo": 2}}
    manifest["rounds"][1]["rejects"] = {"a": {}, "b": {"markup": 4}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    invoke(str(out))
    html = (out / "report" / "index.html").read_text()
    assert "<th>rejected</th>" in html  # and a column of the rounds table
    assert (
        "ε VOID:</strong> the noise came from a public --noise-seed" in html and 'class="card void"' in html
    )
    rejects = html.split('<section id="rejects">')[1].split("</section>")[0]
    assert '<td>echo</td><td class="n">3</td><td class="n">2</td><td class="n">5</td>' in rejects
    assert '<td>all</td><td class="n">4</td><td class="n">6</td><td class="n">10</td>' in rejects
    assert "No quality gate" not in html


def test_a_run_from_before_the_quality_gate_says_so(tmp_path):
    out, _, _ = make_run(tmp_path, n=24, rounds=2)
    manifest = json.loads((out / "manifest.json").read_text())
    for record in manifest["rounds"]:
        record.pop("rejects", None)
    (out / "manifest.json").write_text(json.dumps(manifest))
    invoke(str(out))
    html = (out / "report" / "index.html").read_text()
    assert "No quality gate in this run." in html and "<th>rejected</th>" not in html


def test_a_folder_without_a_run_is_one_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a finished run: manifest.json is missing" in " ".join(result.output.split())


def test_an_out_that_cannot_be_the_report_folder_is_refused_before_anything_is_written(run, tmp_path):
    """The report is a folder (index.html and its PNGs): a page name, or a file at --out, is one
    clear error, and nothing is written; an existing folder of any name is used."""
    run_dir, _, _ = run
    (tmp_path / "a-file").write_text("x")
    for out, expected in ((tmp_path / "page.html", f"e.g. --out {tmp_path / 'page'}"),
                          (tmp_path / "a-file", "exists and is not a folder")):  # fmt: skip
        result = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(out)])
        assert result.exit_code == 2 and expected in " ".join(result.output.split()), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    (tmp_path / "kept.html").mkdir()  # a folder that happens to end in .html
    invoke(str(run_dir), "--out", str(tmp_path / "kept.html"))
    assert (tmp_path / "kept.html" / "index.html").is_file()


# ----- in a real browser ------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def open_in_chromium(page_path: Path, screenshot: Path, width: int = 1180) -> dict:
    """Load the page in headless Chromium: console messages, page errors, images, a screenshot."""
    from playwright import sync_api  # a dev dependency: missing, the test fails (only Chromium may be absent)

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": width, "height": 900})
            console, errors, requests = [], [], []
            tab.on("console", lambda msg: console.append((msg.type, msg.text)))
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.on("request", lambda req: requests.append(req.url))
            tab.goto(page_path.as_uri(), wait_until="load")
            images = tab.eval_on_selector_all(
                "img", "els => els.map(e => [e.getAttribute('src'), e.complete, e.naturalWidth])"
            )
            headings = tab.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
            tab.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return {
        "console": console,
        "errors": errors,
        "images": images,
        "headings": headings,
        "requests": requests,
    }


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium (apt-get install chromium)")
@pytest.mark.parametrize("operator", [False, True])
def test_the_page_renders_in_a_real_browser(run, tmp_path, monkeypatch, operator):
    out, private, _ = run
    folder = tmp_path / "report"
    if operator:
        monkeypatch.setattr("wasp_vllm.engines.embedder.Embedder", HashEmbedderForTests)
        invoke(str(out), "--out", str(folder), "--private", str(private))
    else:
        invoke(str(out), "--out", str(folder))
    seen = open_in_chromium(folder / "index.html", tmp_path / "shot.png")
    assert not [m for m in seen["console"] if m[0] == "error"], seen["console"]
    assert seen["errors"] == []
    expected = {"weights.png", "labels.png", "work.png"} | ({"fid.png"} if operator else set())
    assert {src for src, _, _ in seen["images"]} == expected
    assert all(done and width > 0 for _, done, width in seen["images"]), seen["images"]
    assert all(url.startswith("file://") for url in seen["requests"]), seen["requests"]
    assert "Privacy spent" in seen["headings"] and "Samples" in seen["headings"]
    shot = (tmp_path / "shot.png").read_bytes()
    width, height = png_size(shot)
    assert width >= 1000 and height > 1500 and len(shot) > 50_000  # a long page, not a blank one
