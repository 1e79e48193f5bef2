"""Each chapter's downloadable notebook runs top to bottom in a fresh kernel, in a folder outside the repository.

The notebooks are the built site's (``BOOK_SITE`` or ``docs/_build/html``, ``_sources/**/*.ipynb``), as a reader
downloads them; each is copied alone into a temporary folder and run there with nbclient, so nothing of the
repository (the benchmark record, the figure style) is within reach. Where attention_ref is missing, the
notebook's first cell says how to install it and stops.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import IN_CI, python_without_the_package, require

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
NOTEBOOKS = sorted((SITE / "_sources").rglob("*.ipynb")) if (SITE / "_sources").is_dir() else []

pytestmark = pytest.mark.docs


def _site():
    if not NOTEBOOKS:
        if IN_CI:
            pytest.fail(f"no built notebooks in {SITE}/_sources")
        pytest.skip(f"no built notebooks in {SITE}/_sources (run `make docs`)")


@pytest.mark.parametrize("name", [path.relative_to(SITE / "_sources").as_posix() for path in NOTEBOOKS] or ["none"])
def test_downloaded_notebook_runs_anywhere(name, tmp_path):
    _site()
    nbformat = require("nbformat")
    nbclient = require("nbclient")
    copy = tmp_path / Path(name).name
    shutil.copyfile(SITE / "_sources" / name, copy)
    notebook = nbformat.read(copy, as_version=4)
    assert "setup" in notebook.cells[0].metadata.get("tags", []), "the first cell is not the setup check"
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    assert sorted(path.name for path in tmp_path.iterdir()) == [copy.name], "the notebook wrote files"


def test_the_first_cell_says_how_to_install_the_package(tmp_path):
    _site()
    source = json.loads(NOTEBOOKS[0].read_text())["cells"][0]["source"]
    source = "".join(source) if isinstance(source, list) else source
    result = subprocess.run([*python_without_the_package(), "-c", source], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode != 0
    assert '%pip install "attention_ref @ git+' in result.stdout, result.stdout
    assert "ModuleNotFoundError" in result.stderr
