"""The Read the Docs configuration is valid and builds the book the way ``make docs`` does, to the same text.

Read the Docs installs the package with the ``docs`` extra only: no PyTorch, no JAX. The last test builds the book
that way and compares every page's text with the main build's (``docs/_build/html``, made by ``make docs`` just
before the tests in ``make test``, with the frameworks installed): the same, apart from the notes marked
``framework-record`` that say whether a page's framework results ran live or were recorded
(``attention_ref.records``).

The same build also changes the rounding without changing the meaning, as another machine would: BLAS runs on one
thread (``OPENBLAS_NUM_THREADS=1``; the main build runs on every core, where some products split their sums
differently) and the package's dense kernel always takes its path that subtracts the row maximum (the main build
skips the shift where a bound proves ``exp`` cannot overflow, which rounds differently). So its notebooks are also
compared with the committed ones (``notebooks/``) by ``_launch_notebooks.differences``, the rule ``make notebooks``
keeps them by: every glued number and every line of Markdown must be the same, printed numbers may move only by
rounding. A page that printed or glued the last digits of a rounding error fails here, not on another machine.
(``OPENBLAS_CORETYPE`` is left as it is: see the tool library's machine notes.)

The docs-only environment is simulated rather than installed (a second virtual environment would need the network
or a wheel cache, and minutes): every distribution the ``docs`` extra pulls in is found from the installed
packages' own metadata, and a ``sitecustomize`` module on ``PYTHONPATH`` makes every other top-level module
(torch, jax, pytest, hypothesis, playwright, ...) unimportable in the Sphinx process and in the kernels it starts,
as it would be absent on Read the Docs (``find_spec`` returns None and ``import`` raises ``ModuleNotFoundError`` for
a module set to None in ``sys.modules``).
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import IN_CI, ext_module, require
from test_docs_build import _sphinxopts
from test_docs_reproducible import MAIN, WARNING_LINE, _source_date_epoch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".readthedocs.yaml"
RECORD_NOTE = "framework-record"  # the class of the notes that may differ between the two builds
# The docs-only build's other rounding: the dense kernel's bound never used (every call smaller than this many
# scores subtracts the row maximum), BLAS on one thread, and NumPy's AVX-512 loops off (as on an AVX2 machine).
ALWAYS_SHIFT = 1 << 62


def _avx512_groups():
    """NumPy's dispatched CPU feature groups beyond AVX2 that this machine runs (none on an AVX2 machine): disabling
    them (``NPY_DISABLE_CPU_FEATURES``) makes NumPy run the loops an AVX2 machine runs (its ``sin``, ``arctan``,
    ``log1p`` and others round differently there)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name) and
            (name == "X86_V4" or name.startswith("AVX512"))]


OTHER_ROUNDING = {"OPENBLAS_NUM_THREADS": "1", "NPY_DISABLE_CPU_FEATURES": " ".join(_avx512_groups())}


def _check_jsonschema(path):
    require("check_jsonschema")
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is installed but its script is not on PATH"
    return subprocess.run(
        [exe, "--builtin-schema", "vendor.readthedocs", str(path)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def config():
    yaml = require("yaml")
    return yaml.safe_load(CONFIG.read_text())


def test_config_matches_the_vendored_schema():
    result = _check_jsonschema(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_config(tmp_path):
    bad = tmp_path / ".readthedocs.yaml"
    bad.write_text(CONFIG.read_text().replace("fail_on_warning: true", "fail_on_warning: sometimes"))
    assert bad.read_text() != CONFIG.read_text()
    result = _check_jsonschema(bad)
    assert result.returncode != 0
    assert "fail_on_warning" in result.stdout + result.stderr


def test_config_builds_like_make_docs(config):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["version"] == 2
    assert config["sphinx"]["fail_on_warning"] is True
    assert (ROOT / config["sphinx"]["configuration"]).is_file()
    lock, install = config["python"]["install"]
    # The committed lock's exact versions, as `make docs` installs them (Makefile: -c requirements/docs.txt).
    assert lock == {"requirements": "requirements/docs.txt"}
    assert "-c $(LOCK)/docs.txt" in (ROOT / "Makefile").read_text()
    assert install["method"] == "pip" and install["path"] == "."
    extras = pyproject["project"]["optional-dependencies"]
    # The docs extra and nothing else: the hosted book is built without PyTorch, JAX and transformers, as the last
    # test does.
    assert install["extra_requirements"] == ["docs"]
    assert not {"torch", "jax", "jaxlib", "transformers"} & {re.split(r"[\[<>=!~ ;]", req)[0] for req in extras["docs"]}
    # Read the Docs' Python satisfies requires-python.
    minimum = pyproject["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, config["build"]["tools"]["python"].split("."))) >= tuple(map(int, minimum.split(".")))


def installed_closure(extras):
    """Canonical names of the installed distributions that ``pip install .[extras]`` brings in, from their metadata."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen, todo = set(), set(), [("attention_ref", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in seen:
            continue
        seen.add((canonicalize_name(name), wanted))
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:  # not installed here: not importable in either build
            continue
        found.add(canonicalize_name(name))
        for requirement in map(Requirement, requires):
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in wanted or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def modules_outside(extras):
    """Top-level modules installed here that no distribution of ``.[extras]`` provides."""
    from packaging.utils import canonicalize_name

    closure = installed_closure(extras)
    return sorted(module for module, dists in importlib.metadata.packages_distributions().items()
                  if module.isidentifier() and not any(canonicalize_name(d) in closure for d in dists))


@pytest.fixture(scope="module")
def docs_only_env(config, tmp_path_factory):
    """The environment of a build with Read the Docs' extras only: everything else unimportable."""
    require("packaging")
    shim = tmp_path_factory.mktemp("docs_only")
    blocked = modules_outside(config["python"]["install"][-1]["extra_requirements"])
    (shim / "sitecustomize.py").write_text(
        "# Makes what Read the Docs would not install unimportable, and changes the rounding of the package's\n"
        "# dense kernel (its other path: always subtract the row maximum) (tests/test_readthedocs.py).\n"
        "import sys\n\n"
        f"for _name in {blocked!r}:\n"
        "    sys.modules.setdefault(_name, None)\n\n"
        "import attention_ref._kernel\n\n"
        f"attention_ref._kernel._BOUND_MIN = {ALWAYS_SHIFT}\n"
    )
    path = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "SOURCE_DATE_EPOCH": _source_date_epoch(), **OTHER_ROUNDING}


def test_docs_only_environment_lacks_the_frameworks_and_has_the_book(docs_only_env):
    probe = ("import importlib.util as u\n"
             "print([m for m in ('torch', 'jax', 'pytest') if u.find_spec(m) is not None])\n"
             "import myst_nb, sphinx_book_theme, attention_ref, ipykernel, matplotlib, ml_dtypes, hypothesis\n"
             "import torch\n")
    result = subprocess.run([sys.executable, "-c", probe], env=docs_only_env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout == "[]\n", result.stdout + result.stderr
    assert "ModuleNotFoundError: import of torch halted" in result.stderr, result.stderr


def test_docs_only_environment_rounds_another_way(docs_only_env):
    probe = ("import attention_ref._kernel as k, threadpoolctl\n"
             "from numpy.lib.introspect import opt_func_info\n"
             "targets = {t['current'] for f in opt_func_info().values() for t in f.values()}\n"
             "print(k._BOUND_MIN, [i['num_threads'] for i in threadpoolctl.threadpool_info()"
             " if i['user_api'] == 'blas'], sorted(t for t in targets if 'X86_V4' in t or 'AVX512' in t))")
    result = subprocess.run([sys.executable, "-c", probe], env=docs_only_env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == f"{ALWAYS_SHIFT} [1] []\n", result.stdout


class PageText(HTMLParser):
    """A page's text and images (source and alt text), without scripts, styles and the notes marked `RECORD_NOTE`."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                      "wbr"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.words, self.notes, self._skip, self._note = [], [], 0, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self._skip:
            self._skip += tag not in self.VOID
            if self._note is not None and tag == "img":
                self._note.append(f"[image {attrs.get('src')} {attrs.get('alt')}]")
            return
        if tag in {"script", "style"} or RECORD_NOTE in (attrs.get("class") or "").split():
            self._skip = 1
            self._note = [] if tag not in {"script", "style"} else None
        elif tag == "img":
            self.words.append(f"[image {attrs.get('src')} {attrs.get('alt')}]")

    def handle_endtag(self, tag):
        if self._skip and tag not in self.VOID:
            self._skip -= 1
            if not self._skip and self._note is not None:
                self.notes.append(" ".join(" ".join(self._note).split()))
                self._note = None

    def handle_data(self, data):
        (self.words if not self._skip else self._note if self._note is not None else []).append(data)

    @classmethod
    def read(cls, html):
        """(text, notes) of the page `html`, whitespace collapsed."""
        parser = cls()
        parser.feed(html)
        parser.close()
        return " ".join(" ".join(parser.words).split()), parser.notes


def site_pages(site):
    """{page path: (text, notes)} for every HTML page of a built site (not the files under _static and the like)."""
    pages = (path for path in sorted(site.rglob("*.html")) if not path.relative_to(site).parts[0].startswith("_"))
    return {path.relative_to(site).as_posix(): PageText.read(path.read_text(encoding="utf-8")) for path in pages}


FIGURE_FILE = re.compile(r"_images/[0-9a-f]{64}\.(?:png|svg|jpg)")


def differing_pages(main, other):
    """{page: what differs} between two sites' pages, ignoring the marked notes; numbers may differ by rounding only
    (``_launch_notebooks.numbers_close``: a printed value's last digits move with the build's rounding)."""
    numbers_close = ext_module("_launch_notebooks", "myst_nb").numbers_close
    differ = {page: "missing from the docs-only build" for page in main.keys() - other.keys()}
    differ |= {page: "missing from the main build" for page in other.keys() - main.keys()}
    for page in sorted(main.keys() & other.keys()):
        # A figure is named for its pixels' hash, which rounding may move: compared by its presence and alt text.
        a, b = (FIGURE_FILE.sub("_images/<figure>", site[page][0]) for site in (main, other))
        if not numbers_close(a, b):
            start = next(i for i, (x, y) in enumerate(zip(a + "\0", b + "\0", strict=False)) if x != y)
            around = slice(max(0, start - 80), start + 120)
            differ[page] = f"main: ...{a[around]!r}\ndocs-only: ...{b[around]!r}"
    return differ


def test_selftest_differences_outside_the_marked_notes_are_caught():
    page = ('<html><body><p>Same text.</p><div class="admonition note framework-record"><p>The results {}.</p>'
            '</div><pre>{}</pre><img src="_images/a.svg" alt="A plot"/><script>var x = {};</script></body></html>')
    assert PageText.read(page.format("ran live", "tensor([nan, nan])", 1)) == (
        "Same text. tensor([nan, nan]) [image _images/a.svg A plot]", ["The results ran live."])
    texts = {name: {"ch.html": PageText.read(page.format(*args))} for name, args in {
        "live": ("ran live", "tensor([nan, nan])", 1),
        "recorded": ("are recorded", "tensor([nan, nan])", 2),
        "broken": ("are recorded", "PyTorch is not installed: skipping the comparison.", 2)}.items()}
    assert differing_pages(texts["live"], texts["recorded"]) == {}
    broken = differing_pages(texts["live"], texts["broken"])
    assert list(broken) == ["ch.html"] and "not installed" in broken["ch.html"], broken
    assert list(differing_pages(texts["live"], {})) == ["ch.html"]
    # A figure whose pixels moved by rounding has another hashed name: the same page; other alt text is not.
    figure = ('<html><body><p>Max 0.5000000000000001.</p><img src="../_images/{}.png" alt="{}"/></body></html>')
    one, two = "a" * 64, "b" * 64
    assert differing_pages({"f.html": PageText.read(figure.format(one, "A plot"))},
                           {"f.html": PageText.read(figure.format(two, "A plot").replace("01.", "1."))}) == {}
    assert differing_pages({"f.html": PageText.read(figure.format(one, "A plot"))},
                           {"f.html": PageText.read(figure.format(one, "Another plot"))})


@pytest.fixture(scope="module")
def docs_only_site(docs_only_env, tmp_path_factory):
    """The book built as Read the Docs builds it, with the other rounding (a fresh execution cache: every chapter
    runs)."""
    if not (MAIN / "index.html").is_file():
        if IN_CI:
            pytest.fail(f"the main build {MAIN} is required in CI (make docs)")
        pytest.skip(f"{MAIN} not built (make docs)")
    build = tmp_path_factory.mktemp("docs_only_build")
    out = build / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", *_sphinxopts(), "-b", "html", "-d", str(build / "doctrees"),
         str(ROOT / "docs"), str(out)],
        cwd=ROOT, env=docs_only_env, capture_output=True, text=True, timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if WARNING_LINE.search(line)]
    assert warnings == [], warnings
    return out


@pytest.mark.docs
def test_docs_only_build_reads_like_the_main_build(docs_only_site):
    main, docs_only = site_pages(MAIN), site_pages(docs_only_site)
    differ = differing_pages(main, docs_only)
    assert not differ, f"{len(differ)} of {len(main)} pages read differently without PyTorch and JAX:\n" + "\n".join(
        f"{page}:\n{what}" for page, what in differ.items())
    # Each page that reads the record says so, with the recorded versions, in its marked note.
    recorded = [(page, note) for page, (_, notes) in docs_only.items() for note in notes]
    assert len(recorded) >= 3 and all("are recorded: computed with PyTorch" in note for _, note in recorded), recorded


@pytest.mark.docs
def test_rounded_another_way_the_notebooks_are_the_committed_ones(docs_only_site):
    """Every glued number, every line of Markdown and every line of code of the committed notebooks is what this
    build made; printed numbers moved by rounding at most (``_launch_notebooks.differences``, the one rule)."""
    launch = ext_module("_launch_notebooks", "myst_nb")
    built = sorted((docs_only_site / "_sources").rglob("*.ipynb"))
    assert len(built) == len(launch.sources())
    found = {}
    for path in built:
        page = path.relative_to(docs_only_site / "_sources").as_posix()
        committed = json.loads((launch.TARGET / page).read_text(encoding="utf-8"))
        mine = json.loads(path.read_text(encoding="utf-8"))
        assert mine["metadata"]["attention_ref"]["frameworks"] == []  # the docs extra only
        found.update({f"{page}, cell {index}": why for index, why in
                      launch.differences(committed, mine, skip_setup=True)})
    assert not found, "a page shows rounding error's digits (state a bound instead):\n" + "\n".join(
        f"{where}: {why}" for where, why in found.items())
