"""The committed notebooks the Binder and Colab links open (``notebooks/``, written by ``make notebooks``).

They must be current (each is what ``docs/_ext/_launch_notebooks.py`` makes from the built book's notebook of its
chapter now), hold the same cells as the downloadable notebooks the build executes (which tests/test_notebooks_run.py
runs outside the repository) with the same outputs, so the figures show before anything runs, and start with a
setup cell that installs what is missing when run in Colab and says how elsewhere. "The same" is one rule for every
test here (``_launch_notebooks.differences``): code and Markdown equal, printed numbers equal up to rounding,
figures by presence and alt text. tests/test_readthedocs.py applies it to a build that rounds another way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import IN_CI, ext_module, python_without_the_package

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
REQUIREMENT = "attention_ref @ git+https://github.com/example/book.git@main"


@pytest.fixture(scope="module")
def launch():
    return ext_module("_launch_notebooks", "myst_nb")


def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _site():
    if not (SITE / "_sources").is_dir():
        if IN_CI:
            pytest.fail(f"no built notebooks in {SITE}/_sources")
        pytest.skip(f"no built notebooks in {SITE}/_sources (run `make docs`)")
    return SITE


def _as_built(launch, page, source, markdown="Text with 1024 written in."):
    """A stand-in for the build's downloaded notebook of chapter `source`: its code cells (from MyST-NB's reading),
    one Markdown cell, an output, and the chapter's digest."""
    from myst_nb.core.read import read_myst_markdown_notebook  # launch needs myst_nb: the fixture checked it

    read = json.loads(json.dumps(read_myst_markdown_notebook(source.read_text())))
    cells = [cell for cell in read["cells"] if cell["cell_type"] == "code"]
    for cell in cells:
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    cells.insert(0, {"cell_type": "markdown", "id": "m", "metadata": {}, "source": markdown})
    digest = launch.source_digest(source)
    record = {"source": f"docs/{page}.md", "source_sha256": digest}
    metadata = {"kernelspec": read["metadata"]["kernelspec"], "file_format": "x", "attention_ref": record}
    return {**read, "cells": cells, "metadata": metadata}


@pytest.mark.docs
def test_the_committed_notebooks_are_current(launch):
    stale = launch.stale(site=_site())
    assert not stale, "run `make notebooks`: " + ", ".join(
        f"{path.relative_to(ROOT)} ({'left over' if text is None else 'not current'})" for path, text in stale.items())


def test_every_chapter_has_one(launch):
    pages = launch.sources()
    assert {"chapters/01_queries_keys_values", "chapters/performance", "faq"} <= set(pages)
    committed = {path.relative_to(launch.TARGET).with_suffix("").as_posix() for path in launch.TARGET.rglob("*.ipynb")}
    assert committed == set(pages)


def test_the_check_finds_a_stale_notebook(launch, tmp_path):
    """Against a copy: a chapter edited after the book was built (refused), then built again (stale), and a
    notebook left over."""
    docs, target, site = tmp_path / "docs", tmp_path / "notebooks", tmp_path / "html"
    (docs / "chapters").mkdir(parents=True)
    (site / "_sources" / "chapters").mkdir(parents=True)

    def build():
        for page in ("chapters/01_queries_keys_values", "faq"):
            built = _as_built(launch, page, docs / f"{page}.md")
            (site / "_sources" / f"{page}.ipynb").write_text(json.dumps(built))

    for page in ("chapters/01_queries_keys_values", "faq"):
        (docs / f"{page}.md").write_text((launch.DOCS / f"{page}.md").read_text())
    build()
    launch.write(target, docs, site, install=REQUIREMENT)
    assert launch.stale(target, docs, site) == {}
    chapter = docs / "chapters" / "01_queries_keys_values.md"
    chapter.write_text(chapter.read_text().replace("temperature=1.0", "temperature=2.0", 1))
    with pytest.raises(launch.BookNotBuilt, match=r"01_queries_keys_values\.ipynb was built from another text"):
        launch.stale(target, docs, site)
    build()
    (target / "gone.ipynb").write_text("{}")
    stale = launch.stale(target, docs, site)
    assert set(stale) == {target / "chapters" / "01_queries_keys_values.ipynb", target / "gone.ipynb"}
    assert stale[target / "gone.ipynb"] is None
    # The requirement the file records is kept when it is rebuilt, and so are the built notebook's outputs.
    rebuilt = json.loads(stale[target / "chapters" / "01_queries_keys_values.ipynb"])
    assert repr(REQUIREMENT) in _source(rebuilt["cells"][0])
    assert "temperature=2.0" in "".join(_source(cell) for cell in rebuilt["cells"])
    setup, *cells = rebuilt["cells"]
    assert setup["outputs"] == [] and setup["execution_count"] is None
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert code and all(cell["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
                        for cell in code)
    assert [cell["execution_count"] for cell in code] == list(range(2, len(code) + 2))  # as in the download
    assert rebuilt["cells"][1]["source"] == "Text with 1024 written in."
    assert set(rebuilt["metadata"]) == {"kernelspec", "language_info", "attention_ref"}


def test_outputs_that_moved_by_rounding_are_not_stale_but_text_is(launch, tmp_path):
    """One rule (``differences``): a printed number that moved by rounding on another machine, or a figure's pixels,
    leave the notebook current; a number that moved more, other words, Markdown or code do not."""
    docs, target, site = tmp_path / "docs", tmp_path / "notebooks", tmp_path / "html"
    (docs / "chapters").mkdir(parents=True)
    (site / "_sources" / "chapters").mkdir(parents=True)
    page = "chapters/01_queries_keys_values"
    (docs / f"{page}.md").write_text((launch.DOCS / f"{page}.md").read_text())
    built = _as_built(launch, page, docs / f"{page}.md", markdown="Agree: ![A plot](data:image/png;base64,AAAA)")
    code = next(cell for cell in built["cells"] if cell["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "0.39712105240985407 and 3 heads\n"},
                       {"output_type": "display_data", "metadata": {},
                        "data": {"image/png": "AAAA", "text/plain": "<Figure size 640x480 with 1 Axes>"}}]
    (site / "_sources" / f"{page}.ipynb").write_text(json.dumps(built))
    launch.write(target, docs, site, install=REQUIREMENT)
    path = target / f"{page}.ipynb"
    assert launch.stale(target, docs, site) == {}

    def changed(edit):
        committed = json.loads(launch.launch_notebook(built, REQUIREMENT))
        edit(committed["cells"][1:])
        path.write_text(json.dumps(committed))
        return set(launch.stale(target, docs, site)) == {path}

    def output(cells, text=None, image=None):
        cell = next(cell for cell in cells if cell["cell_type"] == "code")
        if text is not None:
            cell["outputs"][0]["text"] = text
        if image is not None:
            cell["outputs"][1]["data"]["image/png"] = image

    def markdown(cells, old, new):
        cells[0]["source"] = cells[0]["source"].replace(old, new)

    assert not changed(lambda cells: output(cells, text="0.3971210524098536 and 3 heads\n"))  # rounding
    # `make notebooks` leaves such a notebook as it is: a change elsewhere does not rewrite it.
    kept = path.read_text()
    assert launch.write(target, docs, site, install=REQUIREMENT) == [] and path.read_text() == kept
    assert launch.write(target, docs, site, install="other") == [path]  # another requirement: rewritten
    assert not changed(lambda cells: output(cells, image="BBBB"))  # a figure's pixels
    assert not changed(lambda cells: markdown(cells, "AAAA", "BBBB"))  # an embedded figure's pixels
    assert changed(lambda cells: output(cells, text="0.39712 and 3 heads\n"))  # printed to other digits
    assert changed(lambda cells: output(cells, text="0.39712105240985407 and 4 heads\n"))
    assert changed(lambda cells: output(cells, text="0.39712105240985407 and 3 heads!\n"))
    assert changed(lambda cells: cells[1]["outputs"].pop())  # a figure gone
    assert changed(lambda cells: markdown(cells, "A plot", "Another plot"))  # alt text
    assert changed(lambda cells: markdown(cells, "Agree", "Agree to 1.4e-15"))
    assert changed(lambda cells: cells[1].update(source=_source(cells[1]) + "\n# edited"))


def test_framework_notes_differ_only_between_builds_with_different_frameworks(launch):
    """A build with the docs extra only reads its framework results from the record: its notes say so. Compared
    with a committed notebook from a build with the frameworks, that note is the one text allowed to differ."""
    from attention_ref.records import FrameworkRecord

    recorded = {"demo": {"versions": {"no_such_framework": "1.0"}, "cases": {}}}
    live_note = FrameworkRecord("demo", recorded, needs=("numpy",)).note()  # numpy is installed: live
    recorded_note = FrameworkRecord("demo", recorded, needs=("no_such_framework",)).note()
    assert live_note.startswith("ran live") and recorded_note.startswith("are recorded")

    def notebook(note, frameworks, tail=""):
        cells = [{"cell_type": "markdown", "source": f"The PyTorch results on this page {note}.{tail}"}]
        return {"cells": cells, "metadata": {"attention_ref": {"frameworks": frameworks}}}

    main, docs_only = notebook(live_note, ["torch"]), notebook(recorded_note, [])
    assert launch.differences(main, docs_only) == []
    assert launch.differences(main, notebook(recorded_note, ["torch"]))  # like builds: the notes must agree
    assert launch.differences(main, notebook(recorded_note, [], tail=" More."))  # only the note may differ


def test_without_a_build_it_says_to_build_first(launch, tmp_path):
    with pytest.raises(launch.BookNotBuilt, match="run `make docs` first"):
        launch.stale(tmp_path / "notebooks", launch.DOCS, tmp_path / "html")


@pytest.mark.docs
def test_they_hold_the_code_the_book_runs(launch):
    """Cell for cell, the code, Markdown and outputs of the downloaded notebooks (the ones the build executed and
    the tests run), by the rule ``stale`` uses: outputs' numbers may differ by rounding, figures by their pixels."""
    built = sorted((_site() / "_sources").rglob("*.ipynb"))
    assert len(built) == len(launch.sources())
    for path in built:
        page = path.relative_to(SITE / "_sources").as_posix()
        committed = json.loads((launch.TARGET / page).read_text())
        downloaded = json.loads(path.read_text())
        # The setup cells name different installs.
        assert launch.differences(committed, downloaded, skip_setup=True) == [], page
        assert all(mine.get("attachments") == theirs.get("attachments")
                   for mine, theirs in zip(committed["cells"], downloaded["cells"], strict=True)), page


@pytest.mark.docs
def test_they_show_every_figure_the_page_shows(launch):
    """Each image in a page's article (glued figures, cell outputs, explorables) is in its committed notebook, as an
    embedded image in the Markdown or an image output, so Colab and GitHub show it before anything runs."""
    for page in launch.sources():
        html = (_site() / f"{page}.html").read_text()
        article = html[html.index("<article"):html.index("</article>")]
        # An explorable figure (docs/_ext/explorables/) is interactive on the page and its still image in the
        # notebook.
        shown = len(re.findall(r"<img\b", article)) + article.count("tag_explorable")
        cells = json.loads((launch.TARGET / f"{page}.ipynb").read_text())["cells"]
        embedded = sum(len(re.findall(r"!\[[^\]]+\]\(data:image/", _source(cell)))
                       for cell in cells if cell["cell_type"] == "markdown")
        outputs = sum(any(key.startswith("image/") for key in output.get("data", {}))
                      for cell in cells if cell["cell_type"] == "code" for output in cell["outputs"])
        assert embedded + outputs == shown, (page, embedded, outputs, shown)


def _run_setup(cell, tmp_path, colab):
    """Run a setup cell in the interpreter without the package (and without IPython): Colab's module and
    ``get_ipython`` stand-ins record what the cell asks of them."""
    python = python_without_the_package()
    prelude = (
        "import builtins, sys, types\n"
        "calls = []\n"
        "class Shell:\n"
        "    def run_line_magic(self, name, line): calls.append((name, line))\n"
        "builtins.get_ipython = Shell\n"
        "display = types.ModuleType('IPython.display'); display.display = lambda value: calls.append(('show', value))\n"
        "sys.modules['IPython'] = types.ModuleType('IPython'); sys.modules['IPython.display'] = display\n"
        + ("sys.modules['google.colab'] = types.ModuleType('google.colab')\n" if colab else "")
    )
    after = "\nfrom myst_nb import glue\nglue('x', 42)\nglue('y', 7, display=False)\nprint(calls)\n"
    return subprocess.run([*python, "-c", prelude + _source(cell) + after],
                          capture_output=True, text=True, cwd=tmp_path)


def test_in_colab_the_setup_cell_installs_from_the_repository(launch, tmp_path):
    source = launch.DOCS / "chapters" / "low_precision.md"
    notebook = json.loads(launch.launch_notebook(_as_built(launch, "chapters/low_precision", source), REQUIREMENT))
    result = _run_setup(notebook["cells"][0], tmp_path, colab=True)
    assert result.returncode == 0, result.stderr
    # ml_dtypes: the low-precision page imports it; base Python lacks it (and myst-nb: glue shows the value).
    assert f"""('pip', 'install "{REQUIREMENT}" "ml_dtypes" -q'), ('show', 42)]""" in result.stdout, result.stdout


def test_without_colab_or_repository_the_setup_cell_says_how(launch, tmp_path):
    for install, colab in [(REQUIREMENT, False), (None, True)]:
        notebook = json.loads(launch.launch_notebook(_as_built(launch, "faq", launch.DOCS / "faq.md"), install))
        result = _run_setup(notebook["cells"][0], tmp_path, colab=colab)
        assert result.returncode != 0 and "ModuleNotFoundError: this notebook needs attention_ref" in result.stderr
        assert f'%pip install "{install or "attention_ref @ git+<the repository"}' in result.stdout, result.stdout
        assert "pip install -e ." in result.stdout
