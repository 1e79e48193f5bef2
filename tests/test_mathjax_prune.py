"""The site ships only the MathJax files its pages' MathJax may request (``docs/_ext/mathjax_prune.py``).

What ``tex-chtml.js`` may request is derived here from the scripts themselves, not from the extension's list:
the component names its loader holds (its dependency table, autoload table and menu), followed through the
files they name, less the ones it preloads; the TeX packages ``\\require`` can name (any of the distribution's);
the font files its stylesheet names; the speech rule engine's locale maps. The built site (``BOOK_SITE`` or
``docs/_build/html``) must ship exactly those of them the distribution has. Chromium's check that the pages
render math and load these with no failed request is in tests/test_site.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
from conftest import IN_CI, ext_module

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
# A component name as MathJax's loader writes it: [tex]/cancel, a11y/explorer, output/svg/fonts/tex, ... but not
# a key of its dependency table ("input/tex-full":[...]), which says what a component needs should one load it.
NAME = re.compile(r'"((?:\[(?:tex|mml|sre)\]/|(?:a11y|ui|output|input|adaptors)/)[\w/.-]*)"(?!:\[)')
PATHS = {"[tex]/": "input/tex/extensions/", "[mml]/": "input/mml/extensions/"}


def _distribution():
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None:
        if IN_CI:
            pytest.fail("sphinx-mathjax-offline is not installed")
        pytest.skip("sphinx-mathjax-offline is not installed")
    return Path(spec.origin).parent / "static" / "mathjax"


def requestable(mathjax):
    """Paths under the MathJax folder `mathjax` that its ``tex-chtml.js`` may request, as derived from the scripts."""
    component = (mathjax / "tex-chtml.js").read_text(encoding="utf-8")
    preloaded = {name.removesuffix(".js") for call in re.findall(r"preLoad\(([^)]*)\)", component)
                 for name in re.findall(r'"([^"]+)"', call)}
    # The menu builds "output/" + the renderer it switches to: CHTML (loaded) or SVG.
    assert '"output/"+' in component and '"SVG"' in component
    files, pending, seen = {"tex-chtml.js"}, set(NAME.findall(component)) | {"output/svg"}, set()
    while pending:
        name = pending.pop()
        seen.add(name)
        name = name.removesuffix(".js")
        if name in preloaded or name.endswith("/"):
            continue
        prefix = next((key for key in PATHS if name.startswith(key)), "")
        path = (PATHS[prefix] + name.removeprefix(prefix) if prefix else name).removesuffix(".js") + ".js"
        if (mathjax / path).is_file():
            files.add(path)
            pending |= set(NAME.findall((mathjax / path).read_text(encoding="utf-8"))) - seen
    # \require{name} may name any TeX package of the distribution.
    files |= {path.relative_to(mathjax).as_posix() for path in (mathjax / "input/tex/extensions").glob("*.js")
              if "[tex]/" + path.stem not in preloaded}
    fonts = set(re.findall(r"MathJax_[\w-]+\.woff", component))
    files |= {f"output/chtml/fonts/woff-v2/{font}" for font in fonts}
    if '"[mathjax]/sre/mathmaps"' in component:  # the speech rule engine reads its locale maps from there
        files |= {path.relative_to(mathjax).as_posix() for path in (mathjax / "sre/mathmaps").glob("*.json")}
    return files


def _shipped(root):
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


def test_the_derivation_finds_what_the_pages_need():
    found = requestable(_distribution())
    assert {"tex-chtml.js", "output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff", "input/tex/extensions/cancel.js",
            "output/svg.js", "output/svg/fonts/tex.js", "a11y/explorer.js", "a11y/sre.js", "input/mml.js",
            "sre/mathmaps/en.json"} <= found
    assert not found & {"tex-svg.js", "node-main.js", "input/tex/extensions/ams.js", "ui/menu.js", "input/tex-full.js",
                        "output/chtml/fonts/tex.js", "output/chtml/fonts/woff-v2/MathJax_Math-Regular.woff"}


def test_pruning_keeps_exactly_what_may_be_requested(tmp_path):
    """On a copy of the distribution, as the build prunes it."""
    import shutil

    prune = ext_module("mathjax_prune", "sphinx")
    mathjax = tmp_path / "mathjax"
    shutil.copytree(_distribution(), mathjax)
    before = _shipped(mathjax)
    freed = prune.prune(mathjax)
    assert _shipped(mathjax) == requestable(_distribution()) & before
    assert freed == sum((_distribution() / path).stat().st_size for path in before - _shipped(mathjax))
    assert not [path for path in mathjax.rglob("*") if path.is_dir() and not any(path.iterdir())]


@pytest.mark.docs
def test_the_site_ships_only_what_its_mathjax_may_request():
    mathjax = SITE / "_static" / "mathjax"
    if not mathjax.is_dir():
        if IN_CI:
            pytest.fail(f"no MathJax in {SITE}")
        pytest.skip(f"no MathJax in {SITE} (run `make docs`)")
    assert _shipped(mathjax) == requestable(_distribution()) & _shipped(_distribution())
