"""The notebooks the launch links open: each chapter as a plain ``.ipynb`` in ``notebooks/``, committed.

Corrects what sphinx-book-theme's launch links do for the book's MyST Markdown chapters: they point at the
page's source file (``docs/<page>.md``), which Colab cannot open (it opens ``.ipynb`` files from GitHub only) and
Binder opens as text. So the repository carries each chapter as a notebook, ``notebooks/<page>.ipynb``.

Each is made from the chapter's downloadable notebook in the built site (``docs/_build/html/_sources/``, written
by ``notebook_download``), so it carries the same text: Markdown in which the glued numbers are written in, the
figures embedded and the cross-references made links (``_notebook_markdown``). The values glued by the chapter's
code exist only once it has run, and the build is where it runs (and caches the run): reading them anywhere else
would run the chapters a second time, or reimplement the build's reading of them. The downloaded notebook's
outputs are kept, so Colab, Binder and GitHub show the page's figures and printed values before anything
runs, and the setup cell is written for the requirement given (``notebook_download.runnable_anywhere``). The
downloaded notebook records the SHA-256 of the chapter it was built from; a notebook built from an older text is
refused (build the book first).

Run as a script (``make notebooks``, which builds the book first) to write them, or with ``--check`` to list the
stale ones and exit 1; ``tests/test_launch_notebooks.py`` checks that the committed files are current. The setup
cell installs attention_ref from the repository ``live_code.configured_repository`` names when the files are
written (None if it names none); ``--check`` rebuilds each file with the requirement that file records.

Public API only: MyST-NB's ``is_myst_markdown_notebook`` and nbformat's notebook format. Verified with MyST-NB
1.4.0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from live_code import configured_repository
from myst_nb.core.read import is_myst_markdown_notebook
from notebook_download import install_spec, numbered, runnable_anywhere, source_digest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SITE = DOCS / "_build" / "html"
TARGET = ROOT / "notebooks"


class BookNotBuilt(RuntimeError):
    """The built site has no notebook of a chapter's current text (build the book first)."""


def sources(docs=DOCS):
    """``{page name: path}`` of the MyST notebooks (the chapters) under `docs`, the build folder excluded."""
    found = {}
    for path in sorted(docs.rglob("*.md")):
        relative = path.relative_to(docs)
        if relative.parts[0].startswith("_"):
            continue
        if is_myst_markdown_notebook(path.read_text(encoding="utf-8")):
            found[relative.with_suffix("").as_posix()] = path
    return found


def built_notebook(page, source, site=SITE):
    """The downloaded notebook of `page` in the built `site` (a dict), checked to be built from `source`'s text."""
    path = site / "_sources" / f"{page}.ipynb"
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        digest = notebook["metadata"]["attention_ref"]["source_sha256"]
    except (OSError, ValueError, KeyError) as exc:
        raise BookNotBuilt(f"no built notebook of {page} at {path} ({exc}): run `make docs` first") from None
    if digest != source_digest(source):
        raise BookNotBuilt(f"{path} was built from another text of {source}: run `make docs` first")
    return notebook


def launch_notebook(built, install):
    """The committed notebook, as a string, made from the downloaded notebook `built` (a dict): its cells with
    their outputs (the figures and printed values the page shows, before the reader runs anything), and a setup
    cell installing attention_ref from `install` in place of the built one."""
    cells = [dict(cell) for cell in built["cells"] if "setup" not in cell.get("metadata", {}).get("tags", [])]
    metadata = {key: value for key, value in built["metadata"].items() if key in ("kernelspec", "attention_ref")}
    metadata["language_info"] = {"name": "python"}
    metadata["attention_ref"] = {**metadata.get("attention_ref", {}), "install": install}
    notebook = numbered(runnable_anywhere({**built, "cells": cells, "metadata": metadata}, install))
    notebook["cells"][0]["execution_count"] = None  # the setup cell: not run where the notebook was made
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def _recorded_install(path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))["metadata"]["attention_ref"]["install"]
    except (OSError, ValueError, KeyError):
        return None


def _expected(target, docs, site, install_for):
    """``{path under target: text}`` for every chapter under `docs` (from its notebook in the built `site`), and
    the notebooks under `target` that are no chapter's (left over); `install_for(path)` gives the requirement to
    write into the file at `path`."""
    expected = {}
    for page, source in sources(docs).items():
        path = target / f"{page}.ipynb"
        expected[path] = launch_notebook(built_notebook(page, source, site), install_for(path))
    existing = set(target.rglob("*.ipynb")) if target.is_dir() else set()
    return expected, existing - set(expected)


def _without_outputs(text):
    """A notebook's text with its code cells' outputs left out: what must match the chapter exactly."""
    notebook = json.loads(text)
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
    return notebook


def stale(target=TARGET, docs=DOCS, site=SITE):
    """Files under `target` that differ from their chapter (missing, changed or left over), with what each should hold
    (None: remove). Each is rebuilt with the requirement it records.

    The code and the Markdown (with the values the prose quotes) must match; the outputs need not, since what a
    cell prints can move with the machine that ran the build (a traced memory peak, a deviation from PyTorch, a
    figure's pixels) while the chapter stays the same. ``make notebooks`` refreshes them with everything else."""
    expected, left_over = _expected(target, docs, site, _recorded_install)
    out = {path: text for path, text in expected.items()
           if not path.is_file() or _without_outputs(path.read_text(encoding="utf-8")) != _without_outputs(text)}
    out.update({path: None for path in left_over})
    return out


def write(target=TARGET, docs=DOCS, site=SITE, install=None):
    """Write every chapter's notebook under `target` with attention_ref's pip requirement `install`, and remove the
    left-over ones; the paths written."""
    expected, left_over = _expected(target, docs, site, lambda path: install)
    for path, text in expected.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for path in left_over:
        path.unlink()
    return list(expected)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the stale notebooks and exit 1 if any")
    args = parser.parse_args(argv)
    try:
        return _check() if args.check else _write()
    except BookNotBuilt as exc:
        print(exc, file=sys.stderr)
        return 2


def _check():
    found = stale()
    for path, text in sorted(found.items()):
        print(f"{path.relative_to(ROOT)}: {'left over' if text is None else 'not current'}")
    if found:
        print("run `make notebooks` and commit the result")
    return 1 if found else 0


def _write():
    repository, branch = configured_repository()
    install = install_spec(repository, branch)
    pages = write(install=install)
    print(f"wrote {len(pages)} notebooks to {TARGET.relative_to(ROOT)}/ (attention_ref from {install or 'unknown'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
