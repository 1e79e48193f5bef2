"""The notebooks the launch links open: each chapter as a plain ``.ipynb`` in ``notebooks/``, committed.

Corrects what sphinx-book-theme's launch links do for the book's MyST Markdown chapters: they point at the
page's source file (``docs/<page>.md``), which Colab cannot open (it opens ``.ipynb`` files from GitHub only) and
Binder opens as text. So the repository carries each chapter as a notebook, ``notebooks/<page>.ipynb``:
MyST-NB's own reading of the chapter (its Markdown and code cells, no outputs), made runnable anywhere as the
downloads are (``notebook_download.runnable_anywhere``: a setup cell that installs what is missing in Colab,
the benchmark record embedded), cells numbered. ``live_code`` points the Binder and Colab links there.

Run as a script (``make notebooks``) to write them, or with ``--check`` to list the stale ones and exit 1;
``tests/test_launch_notebooks.py`` checks that the committed files are current. The setup cell installs
attention_ref from the repository ``live_code.configured_repository`` names when the files are written (None
if it names none); ``--check`` rebuilds each file with the requirement that file records.

Public API only: MyST-NB's ``read_myst_markdown_notebook`` and nbformat's notebook format. Verified with MyST-NB
1.4.0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from live_code import configured_repository
from myst_nb.core.read import is_myst_markdown_notebook, read_myst_markdown_notebook
from notebook_download import install_spec, numbered, runnable_anywhere

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TARGET = ROOT / "notebooks"


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


def launch_notebook(source, install, docs=DOCS):
    """The notebook of MyST chapter `source` (a path under `docs`) for the launch links, as a string."""
    notebook = read_myst_markdown_notebook(source.read_text(encoding="utf-8"))
    notebook = json.loads(json.dumps(notebook))  # plain dicts
    metadata = {key: value for key, value in notebook["metadata"].items() if key != "file_format"}
    metadata["language_info"] = {"name": "python"}
    metadata["attention_ref"] = {"source": f"{docs.name}/{source.relative_to(docs).as_posix()}", "install": install}
    notebook["metadata"] = metadata
    notebook = numbered(runnable_anywhere(notebook, install))
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["execution_count"] = None  # not run: no outputs
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def _recorded_install(path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))["metadata"]["attention_ref"]["install"]
    except (OSError, ValueError, KeyError):
        return None


def _expected(target, docs, install_for):
    """``{path under target: text}`` for every chapter under `docs`, and the notebooks under `target` that are
    no chapter's (left over); `install_for(path)` gives the requirement to write into the file at `path`."""
    expected = {}
    for page, source in sources(docs).items():
        path = target / f"{page}.ipynb"
        expected[path] = launch_notebook(source, install_for(path), docs)
    existing = set(target.rglob("*.ipynb")) if target.is_dir() else set()
    return expected, existing - set(expected)


def stale(target=TARGET, docs=DOCS):
    """Files under `target` that differ from their chapter (missing, changed or left over), with what each should hold
    (None: remove). Each is rebuilt with the requirement it records."""
    expected, left_over = _expected(target, docs, _recorded_install)
    out = {path: text for path, text in expected.items()
           if not path.is_file() or path.read_text(encoding="utf-8") != text}
    out.update({path: None for path in left_over})
    return out


def write(target=TARGET, docs=DOCS, install=None):
    """Write every chapter's notebook under `target` with attention_ref's pip requirement `install`, and remove the
    left-over ones; the paths written."""
    expected, left_over = _expected(target, docs, lambda path: install)
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
    if args.check:
        found = stale()
        for path, text in sorted(found.items()):
            print(f"{path.relative_to(ROOT)}: {'left over' if text is None else 'not current'}")
        if found:
            print("run `make notebooks` and commit the result")
        return 1 if found else 0
    repository, branch = configured_repository()
    install = install_spec(repository, branch)
    pages = write(install=install)
    print(f"wrote {len(pages)} notebooks to {TARGET.relative_to(ROOT)}/ (attention_ref from {install or 'unknown'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
