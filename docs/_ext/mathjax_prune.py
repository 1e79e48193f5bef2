"""Ship only the MathJax files the pages' MathJax can request: the published site carries what it loads.

Corrects: sphinx-mathjax-offline copies the whole MathJax 3 distribution into ``_static/mathjax/`` (24 MB:
every combined component, SVG and MathML builds, the Node.js entry point ...), while the pages load one
combined component, ``tex-chtml.js`` (``mathjax_path`` in conf.py), which already holds the loader, the TeX
input with its core packages, the CommonHTML output, the menu and assistive MathML. After the copy (the
package's ``build-finished`` handler, and ``early_assets``' early call of it), every file is removed except
what that component's loader names and may still request, each for a reason (``KEEP``):

- the CommonHTML fonts its stylesheet names (a browser fetches those whose glyphs a page shows);
- the TeX packages ``autoload`` and ``\\require`` fetch on first use (all but those ``tex-chtml.js`` holds);
- what the reader can switch on in MathJax's context menu: the SVG renderer (``output/svg`` and its font), and
  the accessibility tools (the explorer, complexity and semantic enrichment, which loads the MathML input, and
  the speech rule engine with its locale maps, in any of the languages the menu offers).

The kept set is written out here for MathJax 3.2.2. ``tests/test_mathjax_prune.py`` derives it apart, from the
names the shipped scripts hold, and ``tests/test_site.py`` checks in Chromium that math renders and the menu's
components load with no failed request.

The PDF and the EPUB load no MathJax (``epub_math``), but sphinx-mathjax-offline copies it into every builder's
output: there the whole copy is removed.

Public API only: the ``build-finished`` event (after sphinx-mathjax-offline's handler, priority 900).
Verified with sphinx-mathjax-offline 0.0.2 (MathJax 3.2.2) and Sphinx 9.0.4.
"""

from __future__ import annotations

import shutil
from fnmatch import fnmatchcase
from pathlib import Path

from _builders import is_website
from sphinx.errors import ExtensionError

COMPONENT = "mathjax/tex-chtml.js"
# TeX packages tex-chtml.js holds (its loader's preLoad list): never fetched.
PRELOADED_TEX = ("ams", "newcommand", "noundefined", "require", "autoload", "configmacros")
# Paths under _static/mathjax/ (fnmatch patterns) that tex-chtml.js's loader may request.
KEEP = (
    "tex-chtml.js",  # the component the pages load
    "output/chtml/fonts/woff-v2/*.woff",  # CommonHTML's fonts (but UNNAMED_FONTS)
    "input/tex/extensions/*.js",  # TeX packages loaded by autoload or \require (but PRELOADED_TEX)
    "output/svg.js", "output/svg/fonts/tex.js",  # menu: Math Renderer > SVG
    "a11y/explorer.js", "a11y/complexity.js", "a11y/semantic-enrich.js", "a11y/sre.js",  # menu: Accessibility
    "input/mml.js",  # the MathML input semantic enrichment loads
    "sre/mathmaps/*.json",  # the speech rule engine's rules, per locale
)
# A font file of the distribution that no CommonHTML font class of tex-chtml.js names.
UNNAMED_FONTS = ("MathJax_Math-Regular.woff",)


def kept(relative):
    """Whether the file at posix path `relative` (under ``_static/mathjax/``) may be requested by the pages."""
    if relative in {f"input/tex/extensions/{name}.js" for name in PRELOADED_TEX}:
        return False
    if relative in {f"output/chtml/fonts/woff-v2/{name}" for name in UNNAMED_FONTS}:
        return False
    return any(fnmatchcase(relative, pattern) for pattern in KEEP)


def prune(root):
    """Remove from the MathJax folder `root` every file `kept` rejects, and the folders left empty; the bytes freed."""
    freed = 0
    for path in sorted(root.rglob("*"), reverse=True):  # files before the folders that hold them
        if path.is_file() and not kept(path.relative_to(root).as_posix()):
            freed += path.stat().st_size
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return freed


def prune_mathjax(app, exception):
    if exception is not None:
        return
    root = Path(app.outdir) / "_static" / "mathjax"
    if not is_website(app.builder):
        shutil.rmtree(root, ignore_errors=True)
        return
    if app.config.mathjax_path != COMPONENT:
        raise ExtensionError(f"mathjax_prune keeps the files of {COMPONENT}, but mathjax_path is "
                             f"{app.config.mathjax_path!r}: update its KEEP list for that component")
    if root.is_dir():
        prune(root)


def setup(app):
    app.setup_extension("sphinx-mathjax-offline")
    app.connect("build-finished", prune_mathjax, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
