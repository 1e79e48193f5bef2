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
stale ones and exit 1; ``tests/test_launch_notebooks.py`` checks that the committed files are current.

One rule says when a committed notebook holds what a build made (:func:`differences`, used by :func:`stale` and by
every test that compares notebooks): the cells' kinds, code and Markdown are equal, text for text (glued numbers
included, since the book glues only what does not move with the machine); outputs are equal but for the numbers
in them, which may differ by :data:`OUTPUT_RTOL` (a printed value that moved by rounding on another machine's BLAS),
and figures, which are compared by their presence and alt text, not their pixels. Where the two builds had
different frameworks installed (``metadata.attention_ref.frameworks``: a build with the ``docs`` extra only, as
Read the Docs makes, against one with PyTorch and JAX), the framework notes (``attention_ref.records.NOTE``: "ran
live" or "are recorded") are the one text allowed to differ. The setup
cell installs attention_ref from the repository ``live_code.configured_repository`` names when the files are
written (None if it names none); ``--check`` rebuilds each file with the requirement that file records.

Public API only: MyST-NB's ``is_myst_markdown_notebook`` and nbformat's notebook format. Verified with MyST-NB
1.4.0.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from live_code import configured_repository
from myst_nb.core.read import is_myst_markdown_notebook
from notebook_download import install_spec, numbered, runnable_anywhere, source_digest

from attention_ref.records import NOTE

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


#: Largest relative difference allowed between a number printed in a committed notebook's output and the build's.
OUTPUT_RTOL = 1e-9
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_IMAGE_DATA = re.compile(r"data:image/[\w+.-]+;base64,[A-Za-z0-9+/=\s]*")
_IMAGE_MIME = re.compile(r"image/")


def _text(value):
    return "".join(value) if isinstance(value, list) else (value if isinstance(value, str) else json.dumps(value))


def numbers_close(a: str, b: str, rtol: float = OUTPUT_RTOL) -> bool:
    """Whether texts `a` and `b` are equal but for numbers that differ by at most `rtol`, relatively.

    >>> numbers_close("0.39712105240985407 0.3971210524098549", "0.3971210524098536 0.3971210524098552")
    True
    >>> numbers_close("max error 1.4e-15", "max error 8.9e-16"), numbers_close("3 heads", "4 heads")
    (False, False)
    """
    if a == b:
        return True
    words_a, words_b = _NUMBER.split(a), _NUMBER.split(b)
    if words_a != words_b:
        return False
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True):
        u, v = float(x), float(y)
        if not math.isclose(u, v, rel_tol=rtol, abs_tol=0.0):
            return False
    return True


def _output_view(output):
    """What of one output must agree: its kind, its stream's name, its mime types, and each text (images' data left
    out: a figure is compared by its presence and, in the Markdown, its alt text)."""
    kind = output.get("output_type")
    if kind == "stream":
        return kind, output.get("name"), {"text": _text(output.get("text", ""))}
    if kind == "error":
        return kind, output.get("ename"), {"text": output.get("evalue", "")}
    data = output.get("data", {})
    texts = {mime: _IMAGE_DATA.sub("data:image", _text(value)) for mime, value in data.items()
             if not _IMAGE_MIME.match(mime)}
    return kind, tuple(sorted(data)), texts


def _outputs_differ(mine, theirs, rtol):
    """Why two cells' output lists differ (None if they agree by the rule)."""
    if len(mine) != len(theirs):
        return f"{len(mine)} outputs against {len(theirs)}"
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        (kind_a, key_a, texts_a), (kind_b, key_b, texts_b) = _output_view(a), _output_view(b)
        if (kind_a, key_a, texts_a.keys()) != (kind_b, key_b, texts_b.keys()):
            return f"output {index}: {kind_a} {key_a} against {kind_b} {key_b}"
        for mime, text in texts_a.items():
            if not numbers_close(text, texts_b[mime], rtol):
                return f"output {index} ({mime}): {_first_change(text, texts_b[mime])}"
    return None


def _first_change(a, b):
    start = next((i for i, (x, y) in enumerate(zip(a + "\0", b + "\0", strict=False)) if x != y), 0)
    return f"...{a[max(0, start - 60):start + 60]!r} against ...{b[max(0, start - 60):start + 60]!r}"


def _frameworks(notebook):
    return notebook.get("metadata", {}).get("attention_ref", {}).get("frameworks")


def differences(mine, theirs, rtol=OUTPUT_RTOL, skip_setup=False):
    """How notebook `mine` differs from notebook `theirs` (dicts) by the one rule (see the module's docstring), as
    ``[(cell index, what)]``; empty if they agree. `skip_setup` leaves out the first cells, the setup cells, which
    name different installs in a downloaded notebook and a committed one."""
    cells_a, cells_b = mine.get("cells", []), theirs.get("cells", [])
    if len(cells_a) != len(cells_b):
        return [(None, f"{len(cells_a)} cells against {len(cells_b)}")]
    same_frameworks = _frameworks(mine) == _frameworks(theirs)
    found = []
    for index, (a, b) in enumerate(zip(cells_a, cells_b, strict=True)):
        if skip_setup and index == 0:
            continue
        source_a, source_b = _text(a.get("source", "")), _text(b.get("source", ""))
        if a.get("cell_type") == "markdown":
            source_a, source_b = _IMAGE_DATA.sub("data:image", source_a), _IMAGE_DATA.sub("data:image", source_b)
            if not same_frameworks:
                source_a, source_b = NOTE.sub("<framework note>", source_a), NOTE.sub("<framework note>", source_b)
        if a.get("cell_type") != b.get("cell_type") or source_a != source_b:
            found.append((index, f"{a.get('cell_type')} cell: {_first_change(source_a, source_b)}"))
        elif a.get("cell_type") == "code":
            why = _outputs_differ(a.get("outputs", []), b.get("outputs", []), rtol)
            if why is None and a.get("execution_count") != b.get("execution_count"):
                why = f"execution count {a.get('execution_count')} against {b.get('execution_count')}"
            if why is not None:
                found.append((index, why))
    return found


def stale(target=TARGET, docs=DOCS, site=SITE):
    """Files under `target` that differ from their chapter (missing, changed or left over), with what each should hold
    (None: remove). Each is rebuilt with the requirement it records.

    The rule is :func:`differences`: code and Markdown (with the values the prose quotes) equal, outputs equal but
    for rounding in their numbers and figures' pixels. ``make notebooks`` refreshes them with everything else."""
    expected, left_over = _expected(target, docs, site, _recorded_install)
    out = {path: text for path, text in expected.items()
           if not path.is_file() or differences(json.loads(path.read_text(encoding="utf-8")), json.loads(text))}
    out.update({path: None for path in left_over})
    return out


def write(target=TARGET, docs=DOCS, site=SITE, install=None):
    """Write every chapter's notebook under `target` with attention_ref's pip requirement `install`, and remove the
    left-over ones; the paths written.

    A notebook that is current by :func:`differences`, with the same metadata (requirement, source, frameworks), is
    left as it is, so a
    change that does not touch a chapter does not rewrite its notebook with outputs that moved by rounding."""
    expected, left_over = _expected(target, docs, site, lambda path: install)
    written = []
    for path, text in expected.items():
        if path.is_file():
            old, new = json.loads(path.read_text(encoding="utf-8")), json.loads(text)
            if old.get("metadata") == new["metadata"] and not differences(old, new):
                continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    for path in left_over:
        path.unlink()
    return written


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
    print(f"wrote {len(pages)} of {len(sources())} notebooks to {TARGET.relative_to(ROOT)}/ (attention_ref from "
          f"{install or 'unknown'}; the others were current)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
