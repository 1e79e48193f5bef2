"""The book's local Sphinx extensions (``docs/_ext/``) do what their docstrings say they correct.

The behaviours that need a whole build (chapters executed side by side, a complete search index after an
incremental build, a clean log, byte-identical rebuilds, downloadable notebooks) are checked by
tests/test_docs_build.py, tests/test_docs_reproducible.py and tests/test_site.py; these are the parts that can
be shown directly.
"""

import re
import types
from pathlib import Path

import pytest
from conftest import EXT, ext_module, require

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.docs


@pytest.fixture(scope="module")
def ext():
    """Import a module of docs/_ext by name, as Sphinx does with the path docs/conf.py sets."""
    return lambda name: ext_module(name, "sphinx", "myst_nb")


def test_every_extension_says_what_it_corrects_and_is_loaded_by_conf(ext):
    conf = (ROOT / "docs" / "conf.py").read_text()
    packages = [path.parent.name for path in EXT.glob("*/__init__.py")]  # an extension split by concern
    modules = sorted([*(path.stem for path in EXT.glob("*.py")), *packages])
    modules = [name for name in modules if not name.startswith("_")]
    assert "explorables" in packages, packages
    assert len(modules) >= 6, modules
    for name in modules:
        module = ext(name)
        doc = module.__doc__ or ""
        assert re.search(r"Verified\s+with", doc), f"{name}: its docstring names no upstream versions"
        assert "Correct" in doc or "Adds" in doc, f"{name}: its docstring does not say what it corrects or adds"
        assert callable(getattr(module, "setup", None)), f"{name} has no setup()"
        assert f'"{name}"' in conf, f"{name} is not loaded by docs/conf.py"


def test_conf_is_configuration_only():
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert len(conf.splitlines()) < 200  # 150 until the PDF and EPUB settings (issue 30) came in
    assert "def " not in conf and "lambda" not in conf


def test_a_changed_upstream_function_stops_the_build_with_a_clear_message(ext):
    ExtensionError = require("sphinx.errors").ExtensionError  # the docs extra: skips (fails in CI) without it

    upstream = ext("_upstream")

    def handler(app, exc):
        return app, exc

    def renamed(application, exc):
        return application, exc

    Fake = types.ModuleType("fake_module")
    Fake.handler, Fake.renamed = handler, renamed
    assert upstream.require("ext", Fake, "handler", ("app", "exc"), "sphinx") is Fake.handler
    with pytest.raises(ExtensionError, match=r"ext: sphinx \d[\w.]* changed fake_module.renamed: parameters"):
        upstream.require("ext", Fake, "renamed", ("app", "exc"), "sphinx")
    with pytest.raises(ExtensionError, match=r"ext: sphinx \d[\w.]* has no fake_module.gone"):
        upstream.require("ext", Fake, "gone", ("app",), "sphinx")


def test_streams_are_joined_exactly_where_myst_nb_adds_blank_lines(ext):
    coalesce_streams = require("myst_nb.core.utils").coalesce_streams

    nbformat = require("nbformat")
    streams = ext("exact_streams")
    # print("a"); print("b") as a kernel may split it: "a", then the newline together with the next line.
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": "a"},
        {"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {}, "execution_count": 1},
        {"output_type": "stream", "name": "stdout", "text": "\nb\n"},
    ]
    merged = streams.merge_streams([dict(output) for output in outputs])
    assert [output["output_type"] for output in merged] == ["stream", "execute_result"]
    assert merged[0]["text"] == "a\nb\n"
    theirs = coalesce_streams([nbformat.from_dict(dict(output)) for output in outputs])
    assert theirs[0]["text"] == "a\n\nb\n"  # the behaviour exact_streams corrects (MyST-NB 1.4)


def test_the_execution_cache_follows_the_package_source(ext, tmp_path, monkeypatch):
    cache = ext("execution_cache")
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    monkeypatch.setattr(cache, "DOCS", tmp_path / "docs")
    (tmp_path / "attention_ref").mkdir()
    source = tmp_path / "attention_ref" / "softmax.py"
    source.write_text("x = 1\n")
    before = cache.source_fingerprint()
    assert cache.source_fingerprint() == before
    source.write_text("x = 2\n")
    assert cache.source_fingerprint() != before

    class App:
        doctreedir = str(tmp_path / "doctrees")

    class Config:
        nb_execution_cache_path = ""

    stale = tmp_path / "doctrees" / "jupyter_cache" / "0123456789abcdef"
    stale.mkdir(parents=True)
    cache.configure_execution_cache(App, Config)
    assert Config.nb_execution_cache_path == str(tmp_path / "doctrees" / "jupyter_cache" / cache.source_fingerprint())
    assert not stale.exists()


def test_the_execution_cache_follows_every_module_of_the_explorable_figures(ext, tmp_path, monkeypatch):
    """Chapter cells import the explorables package: editing any of its modules (the machinery, or one chapter's
    figures, or a new one) re-executes the chapters."""
    cache = ext("execution_cache")
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    monkeypatch.setattr(cache, "DOCS", tmp_path / "docs")
    package = tmp_path / "docs" / "_ext" / "explorables"
    package.mkdir(parents=True)
    for name in ("__init__", "widgets", "scaling"):
        (package / f"{name}.py").write_text("x = 1\n")
    seen = {cache.source_fingerprint()}
    for name in ("widgets", "scaling"):
        (package / f"{name}.py").write_text("x = 2\n")
        seen.add(cache.source_fingerprint())
    (package / "masks.py").write_text("x = 1\n")  # a new figure's module
    seen.add(cache.source_fingerprint())
    assert len(seen) == 4


def test_the_execution_cache_follows_the_installed_frameworks(ext, monkeypatch):
    """Every framework a page can read from a record counts, with its version (a record may ask for a least one)."""
    cache = ext("execution_cache")
    from attention_ref.records import DISPLAY_NAMES

    assert set(cache.OPTIONAL_FRAMEWORKS) == set(DISPLAY_NAMES) >= {"torch", "jax", "transformers"}
    before = cache.source_fingerprint()
    found = cache.installed_frameworks()
    monkeypatch.setattr(cache, "installed_frameworks", lambda: [*found, "transformers==0.0.1"])
    assert cache.source_fingerprint() != before
    monkeypatch.setattr(cache, "installed_frameworks", lambda: found)
    assert cache.source_fingerprint() == before


def test_kernels_get_encrypted_channels_when_they_support_them(ext):
    zmq = require("zmq")
    execution = ext("chapter_execution")
    manager = execution.EncryptedKernelManager()
    assert manager.transport_encryption == ("auto" if zmq.has("curve") else "disabled")


def test_citations_get_a_role_axe_accepts(ext):
    roles = ext("citation_roles")
    context = {"body": '<div role="list"><div class="citation" role="doc-biblioentry">x</div></div>'}
    roles.fix_citation_roles(None, "api/attention_ref.softmax", "page.html", context, None)
    assert context["body"] == '<div role="list"><div class="citation" role="listitem">x</div></div>'


def test_an_embedded_record_with_nan_is_valid_python(ext, tmp_path, monkeypatch):
    """A recorded NaN (PyTorch's softmax of a fully masked row) is written as float("nan"), not a bare nan."""
    import json
    import math

    download = ext("notebook_download")
    (tmp_path / "docs" / "chapters").mkdir(parents=True)
    record = {"cases": {"empty_row": {"torch.softmax": [float("nan"), float("inf")], "note": "nan"}}}
    (tmp_path / "docs" / "chapters" / "frameworks_record.json").write_text(json.dumps(record))
    monkeypatch.setattr(download, "ROOT", tmp_path)
    source = download._embedded("RECORD = json.loads(RECORD_FILE.read_text())")
    namespace = {"json": json}
    exec(source, namespace)
    values = namespace["RECORD"]["cases"]["empty_row"]
    assert math.isnan(values["torch.softmax"][0]) and values["torch.softmax"][1] == math.inf
    assert values["note"] == "nan"


def test_dropdown_admonitions_fold_in_html_only(ext):
    from docutils import nodes

    dropdowns = ext("dropdowns")

    def page():
        doctree = nodes.document(None, None)
        folded = nodes.admonition("", nodes.title("", "Going deeper: a & b"), nodes.paragraph("", "inside"),
                                  classes=["dropdown"], ids=["deeper"])
        doctree += [folded, nodes.admonition("", nodes.title("", "Exercise"), nodes.paragraph("", "open"))]
        return doctree

    html = types.SimpleNamespace(builder=types.SimpleNamespace(format="html"))
    doctree = page()
    dropdowns.fold_dropdowns(html, doctree, "page")
    folded = list(doctree.findall(dropdowns.folded))
    assert len(folded) == 1 and folded[0]["summary"] == "Going deeper: a & b" and folded[0]["ids"] == ["deeper"]
    assert [child.astext() for child in folded[0].children] == ["inside"]  # the title is the summary now
    assert len(list(doctree.findall(nodes.admonition))) == 1  # the one without the class stays open
    latex = types.SimpleNamespace(builder=types.SimpleNamespace(format="latex"))
    doctree = page()
    dropdowns.fold_dropdowns(latex, doctree, "page")
    assert list(doctree.findall(dropdowns.folded)) == []
