"""mkdocs hooks (mkdocs.yml ``hooks:``): links from a page to the repository's own files.

A page links to ``../examples/bank.py`` or shows ``../bench/results/x.png``: relative links
that work on GitHub, where docs/ sits in the repository.  The site has only docs/, so here
every such file becomes part of the site under ``_repo/`` and the links are pointed there:
``--strict`` still fails on a link to a file that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_OUT = re.compile(r"(\]\()\.\./([^)#\s]+)")
_REPO = "_repo"


def _root(config: Any) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    root = _root(config)
    wanted: set[str] = set()
    for f in files.documentation_pages():
        wanted.update(m.group(2) for m in _OUT.finditer(Path(f.abs_src_path).read_text()))
    for target in sorted(wanted):
        path = (root / target).resolve()
        if path.is_file() and root in path.parents:
            files.append(File.generated(config, f"{_REPO}/{target}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = page.file.src_uri.count("/")
    return _OUT.sub(lambda m: f"{m.group(1)}{'../' * depth}{_REPO}/{m.group(2)}", markdown)
