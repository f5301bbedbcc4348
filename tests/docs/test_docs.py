"""Every snippet of README.md and docs/*.md runs, as a new user would run it (Sybil).

- A ```python block runs in a fresh namespace: it must be self-contained (imports shown, no
  ``...``, no name from another block).  What it prints is kept for the next block.
- An ```output block right after a ```python block is what that block printed, exactly.
- A ```console block is a transcript: each ``$ command`` line runs in a shell at the repo's
  root (the venv's ``cutline`` first on PATH) and must print (standard output, then standard
  error) exactly the lines that follow it; it may fail only if they show its message.
- A block that cannot run in the suite (a 100-kill chaos run, a benchmark) is preceded by
  ``<!-- skip: next "why" -->``; ```text blocks are not code (layouts, file formats).

Snippets that run a pipeline on Spark share the test session's Spark (``spark`` fixture):
``p.run()`` finds it with ``SparkSession.getActiveSession()``.  A page that reads
``$KAFKA_BOOTSTRAP`` (docs/kafka.md) gets the test session's Kafka broker there
(``kafka_broker`` fixture).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LANGUAGES = {"python", "output", "console", "text"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^\s`]*)", re.M)

LAST_OUTPUT = "_docs_last_output"  # document.namespace key: what the last python block printed


def _same(expected: str, actual: str) -> bool:
    def lines(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip("\n").splitlines()]

    return lines(expected) == lines(actual)


class PythonBlocks(CodeBlockParser):
    language = "python"

    def evaluate(self, example: Example) -> str | None:
        namespace = {"__name__": "__main__"}  # a fresh script: nothing from other blocks
        code = compile("\n" * example.line + example.parsed, str(example.path), "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
        example.document.namespace[LAST_OUTPUT] = out.getvalue()
        return None


class OutputBlocks(CodeBlockParser):
    language = "output"

    def evaluate(self, example: Example) -> str | None:
        printed = example.document.namespace.pop(LAST_OUTPUT, None)
        if printed is None:
            return "an ```output block must follow the ```python block that prints it"
        if not _same(example.parsed, printed):
            return f"the block above printed:\n{printed}\nthe docs show:\n{example.parsed}"
        return None


class ConsoleBlocks(CodeBlockParser):
    language = "console"

    def evaluate(self, example: Example) -> str | None:
        steps: list[tuple[str, list[str]]] = []
        for line in example.parsed.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif not steps:
                return f"a ```console block starts with a '$ command' line, not {line!r}"
            else:
                steps[-1][1].append(line)
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                   f"{os.environ.get('PATH', '')}", COLUMNS="200", NO_COLOR="1", TERM="dumb")
        for cmd, lines in steps:
            proc = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=300)
            printed, expected = proc.stdout + proc.stderr, "\n".join(lines)
            # a command that fails is fine when the docs show it failing, with its message
            if proc.returncode != 0 and not expected.strip():
                return f"$ {cmd}\nexited {proc.returncode}:\n{printed}"
            if not _same(expected, printed):
                return f"$ {cmd}\nprinted:\n{printed}\nthe docs show:\n{expected}"
        return None


SYBIL = Sybil(parsers=[PythonBlocks(), OutputBlocks(), ConsoleBlocks(), SkipParser()])


def _needs_spark(text: str) -> bool:
    """A python block runs a pipeline or graph on embedded Spark (not engine="threads")."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return any(re.search(r"\.(run|start)\((?![^)]*engine=\"threads\")", b) for b in blocks)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_snippets_run(path: Path, request: pytest.FixtureRequest, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    if _needs_spark(path.read_text()):
        request.getfixturevalue("spark")
    if "KAFKA_BOOTSTRAP" in path.read_text():  # docs/kafka.md: the test broker (Tansu)
        monkeypatch.setenv("KAFKA_BOOTSTRAP", request.getfixturevalue("kafka_broker").bootstrap)
    monkeypatch.chdir(tmp_path)  # what a snippet writes in its working directory goes here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and its tempfile.mkdtemp()s
    document = SYBIL.parse(path)
    ran = 0
    for example in document.examples():
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue
        ran += 1
    opening = list(FENCE.finditer(path.read_text()))[::2]
    runnable = [m for m in opening if m.group("lang") != "text"]
    assert ran or not runnable, f"{path}: no snippet ran"


def test_every_block_is_checked() -> None:
    """A fence the test above would not run is a mistake: a language it does not know,
    ```output that follows no ```python, a ```console without its '$ ' prompt, an unreasoned
    skip, or a fence indented (inside a list) where Sybil does not look."""
    problems = []
    for path in DOCS:
        text = path.read_text()
        fences = list(FENCE.finditer(text))
        opening = fences[::2]
        if len(fences) % 2:
            problems.append(f"{path.name}: an unclosed ``` fence")
        previous = None
        for m in opening:
            line = text.count("\n", 0, m.start()) + 1
            lang = m.group("lang")
            where = f"{path.relative_to(ROOT)}:{line}"
            if lang not in LANGUAGES:
                problems.append(f"{where}: ```{lang or '(no language)'}; use one of {LANGUAGES}")
            if lang == "output" and previous != "python":
                problems.append(f"{where}: ```output does not follow a ```python block")
            if lang == "console" and not text[m.end():].lstrip("\n").startswith("$ "):
                problems.append(f"{where}: ```console block without a '$ ' command")
            if m.group("indent") and lang in ("python", "output", "console"):
                problems.append(f"{where}: an indented code block is not run; unindent it")
            previous = lang
        for m in re.finditer(r"<!-- skip: (\w+)(.*?)-->", text):
            if m.group(1) == "next" and not m.group(2).strip().startswith('"'):
                problems.append(f"{path.name}: a skip without a reason: {m.group(0)}")
    assert not problems, "\n".join(problems)


def test_readme_links_resolve() -> None:
    """README.md is not part of the site (mkdocs checks docs/ itself): its relative links and
    pictures must name files that exist."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert targets and not missing, missing
