"""The API reference (`make docs`: pdoc over the docstrings) builds offline, and every link in it
resolves: a relative href or src names a file of the build, and an #anchor an id on its page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The Makefile's API_MODULES: the package and each sub-package (a package's __all__ is its public
#: API; pdoc then documents every module of a sub-package that declares none).
PACKAGES = sorted(p.parent.name for p in (ROOT / "wasp_vllm").glob("*/__init__.py"))
MODULES = ["wasp_vllm", *(f"wasp_vllm.{name}" for name in PACKAGES)]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif name in ("href", "src") and value:
                self.links.append(value)


def _parse(page: Path) -> _Page:
    parsed = _Page()
    parsed.feed(page.read_text())
    return parsed


def broken_links(build: Path) -> list[str]:
    pages = {page: _parse(page) for page in build.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            if not link or re.match(r"([a-z]+:|//)", link):  # https:, data:, mailto:, javascript:
                continue
            name, _, anchor = link.partition("#")
            target = (page.parent / name).resolve() if name else page
            if not target.exists():
                broken.append(f"{page.relative_to(build)}: {link} (no such file)")
            elif anchor and target.suffix == ".html" and anchor not in pages[target].ids:
                broken.append(f"{page.relative_to(build)}: {link} (no such anchor)")
    return broken


def test_the_api_reference_builds_offline_and_its_links_resolve(tmp_path: Path) -> None:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pdoc", "--docformat", "restructuredtext", "-o", str(tmp_path), *MODULES]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Warn" not in done.stderr, done.stderr[-3000:]
    front = (tmp_path / "wasp_vllm.html").read_text()
    assert "Generate a DP synthetic labelled data set" in front  # generate's docstring, rendered
    for name in PACKAGES:
        assert (tmp_path / "wasp_vllm" / f"{name}.html").is_file(), name
    assert (tmp_path / "wasp_vllm" / "privacy" / "mechanisms.html").is_file()  # a package without __all__
    assert broken_links(tmp_path) == []
