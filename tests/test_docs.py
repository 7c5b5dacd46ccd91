"""The front page and the manual say what is true: README.md and docs/ (the site `make docs` builds).

- Every relative link in README.md and docs/ names a file that exists, and a heading of it when it
  has an anchor (the site's slugs; docs/runbook.md's headings are deploy/RUNBOOK.md's, which it includes).
- Every code block marked as runnable runs. The mark is an HTML comment on the line before the fence,
  invisible on GitHub and on the site:

      <!-- runs -->
      ```python

  A marked block runs against a real local fleet: in a scratch directory holding `./corpus/web.jsonl`
  (lines {"text": "doc N", "label": N % 7}), with `/data/registry` a scratch registry and the hosts
  `srv-a:7070`, `srv-b:7070` two `shardstream serve` processes over it (tests/support/servers.py; their
  data ports `srv-a:7071`, `srv-b:7071`). `sh` blocks run in order with `bash -e`; a `python` block
  runs once, or, when it trains (calls `train_step`), twice — from the start, then resuming from the
  state a Loader had after RESUME_STEPS steps — with `resuming`, `checkpoint`, `train_step`, `save` and
  `model` defined, and the two runs must deliver every row once and then exactly the rows after that
  state.
- `mkdocs build --strict` (what `make docs` and CI run) builds the site, and fails on a broken link or
  anchor (checked on a copy of docs/ with one of each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

from shardstream.client import Loader

from .support.servers import Servers

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
MARK = "<!-- runs -->"
CORPUS_ROWS = 1000
RESUME_STEPS = 5

FENCE = re.compile(r"^([ \t]*)(```+)([\w-]*)[^\n]*\n(.*?)^\1\2[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!\!)\[[^\]\n]*\]\(([^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (their brackets are not links)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """The ids the site gives the headings of `path` (following --8<-- includes)."""
    text = path.read_text()
    for include in SNIPPET.findall(text):
        text += "\n" + (REPO / include).read_text()
    text = FENCE.sub("", text)
    return {slugify(re.sub(r"`", "", h).strip(), "-") for h in re.findall(r"^#{1,6} (.+?)\s*#*$", text, re.M)}


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_a_front_page() -> None:
    """What a newcomer needs first; everything else is a docs/ page it links."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for heading in ("## Two commands", "## Install", "## Quickstart", "## Documentation"):
        assert heading in readme
    assert "make demo" in readme and "make test" in readme
    linked = {(REPO / t.split("#")[0]).resolve() for t in links(REPO / "README.md")}
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    pages = set(re.findall(r"[\w/.-]+\.md", json.dumps(nav)))
    missing = sorted(p for p in pages if not p.startswith("api/") and (DOCS / p).resolve() not in linked)
    assert missing == [], f"README.md links no page of these: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page: Path) -> None:
    bad = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert bad == [], f"{rel(page)}: " + "; ".join(bad)


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each block marked MARK, in page order."""
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() == MARK:
            assert m.group(3) in ("python", "sh"), f"{rel(page)}: a runnable block must be python or sh"
            blocks.append((m.group(3), m.group(4)))
    assert text.count(MARK) == len(blocks), f"{rel(page)}: a {MARK} mark not right before a fence"
    return blocks


RUNNABLE = [p for p in PAGES if MARK in p.read_text()]


def test_the_readme_quickstart_is_runnable() -> None:
    langs = [lang for lang, _ in runnable_blocks(REPO / "README.md")]
    assert "python" in langs and "sh" in langs


def run_python(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, "<docs block>", "exec"), namespace)  # noqa: S102 (the documented snippet itself)


@pytest.mark.parametrize("page", RUNNABLE, ids=rel)
def test_runnable_blocks_run_against_a_local_fleet(page: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    with open(work / "corpus" / "web.jsonl", "w") as f:
        for i in range(CORPUS_ROWS):
            f.write(json.dumps({"text": f"doc {i}", "label": i % 7}) + "\n")
    registry = tmp_path / "registry"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SHARDSTREAM_ROOT", None)

    def substitute(code: str) -> str:
        return code.replace("/data/registry", str(registry))

    blocks = runnable_blocks(page)
    servers: Servers | None = None
    try:
        for lang, code in blocks:
            if lang == "sh":
                r = subprocess.run(
                    ["bash", "-e", "-c", substitute(code)],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=240,
                )
                assert r.returncode == 0, f"{rel(page)}: sh block failed:\n{code}\n{r.stdout}\n{r.stderr}"
                continue
            if servers is None:
                if not (registry / "web").exists():  # a page without the ingest block: the same ingest
                    subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "shardstream",
                            "ingest",
                            "./corpus/",
                            "--name",
                            "web",
                            "--root",
                            str(registry),
                        ],
                        cwd=work,
                        env=env,
                        check=True,
                        capture_output=True,
                    )
                servers = Servers(registry)
                fleet = [servers.start() for _ in range(2)]
            code = substitute(code)
            for name, server in zip(("srv-a", "srv-b"), fleet, strict=True):
                code = code.replace(f"{name}:7070", server.target)
                code = code.replace(f"{name}:7071", f"127.0.0.1:{server.data_port}")
            if "train_step(" in code:
                run_python_block_twice(page, code, [s.target for s in fleet])
            else:
                run_python(code, {"__name__": "__docs_block__"})
    finally:
        if servers is not None:
            servers.stop_all()


def run_python_block_twice(page: Path, code: str, endpoints: list[str]) -> None:
    with Loader(endpoints, "web@1", batch_size=32, seed=0, columns=["text", "label"]) as ahead:
        first: list[str] = []
        for step, batch in enumerate(ahead):
            first.extend(batch["text"])
            if step + 1 == RESUME_STEPS:
                state = ahead.state_dict()
                break
    everything = {f"doc {i}" for i in range(CORPUS_ROWS)}
    for resuming in (False, True):
        seen: list[str] = []
        saved: list[dict[str, Any]] = []
        namespace: dict[str, Any] = {
            "__name__": "__docs_block__",
            "resuming": resuming,
            "checkpoint": {"data": state},
            "train_step": lambda batch, seen=seen: seen.extend(str(t) for t in batch["text"]),
            "save": saved.append,
            "model": types.SimpleNamespace(state_dict=dict),
        }
        run_python(code, namespace)
        assert len(seen) == len(set(seen)), f"{rel(page)}: a row delivered twice"
        want = everything - set(first) if resuming else everything
        assert set(seen) == want, (
            f"{rel(page)} (resuming={resuming}): {len(seen)} rows, not the {len(want)} expected"
        )


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    r = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    for page in ("index.html", "runbook.html", "loader.html", "api/client.html", "api/checkpoint.html"):
        assert (tmp_path / "site" / page).exists(), page
    runbook = (tmp_path / "site" / "runbook.html").read_text()
    assert 'id="alerts"' in runbook, "the RUNBOOK is included whole"
    api = (tmp_path / "site" / "api" / "client.html").read_text()
    assert "def load_state_dict" in api or "load_state_dict" in api, (
        "the API reference has the Loader's methods"
    )


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    with open(docs / "index.md", "a") as f:
        f.write("\n[gone](no-such-page.md) and [nowhere](loader.md#no-such-heading)\n")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(REPO / h) for h in config["hooks"]]
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(REPO / p) for p in python["paths"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    r = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "no-such-page.md" in out and "no-such-heading" in out, out
