# Two commands do all the set-up on a fresh machine: `make docs` and `make test`.
# Both create or refresh the virtual environment in .venv first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -qq
# PyTorch is only needed by the conformance tests; `make test TORCH=` skips installing it.
TORCH ?= torch==2.13.0
# `make docs` installs only what the book needs (the docs extra); `make test` adds the test and browser tools.
# Every install takes its exact versions, transitive ones included, from the committed lock in requirements/
# (pip constraints files written by uv): a new release of a dependency changes nothing here until
# `make upgrade-deps` moves the lock in a commit of its own. pyproject.toml keeps the ranges users get.
LOCK := requirements
DOCS_STAMP := $(VENV)/.installed-docs
LIVE_STAMP := $(VENV)/.installed-live
TEST_STAMP := $(VENV)/.installed-test-$(shell printf '%s' '$(TORCH)' | tr -c 'A-Za-z0-9.' '_')
SPHINXOPTS ?= -W --keep-going -n
BUILD := docs/_build
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 1700000000)
export SOURCE_DATE_EPOCH

.PHONY: all lock upgrade-deps venv docs pdf epub docs-clean notebooks serve test test-fast lint bench bench-quick bench-checks chromium tex \
	clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) -r $(LOCK)/tools.txt

$(DOCS_STAMP): pyproject.toml $(LOCK)/docs.txt | $(PY)
	$(PIP) -e '.[docs]' -c $(LOCK)/docs.txt
	@touch $@

$(TEST_STAMP): pyproject.toml $(LOCK)/test.txt $(DOCS_STAMP)
	$(PIP) -e '.[test,docs,browser,live]' $(TORCH) -c $(LOCK)/test.txt
	@rm -f $(VENV)/.installed-test-*
	@touch $@

venv: $(TEST_STAMP)

## The book: executed chapters, strict (warnings are errors), into docs/_build/html. Sphinx's doctrees and the
## execution cache go to docs/_build/doctrees, beside the site rather than inside it.
docs: $(DOCS_STAMP)
	$(PY) -m sphinx $(SPHINXOPTS) -b html -d $(BUILD)/doctrees docs $(BUILD)/html

## The book to keep: one PDF (docs/_build/latex/attention_ref.pdf, LaTeX with latexmk and XeLaTeX, as Read the Docs
## builds it) and one EPUB (docs/_build/epub/attention_ref.epub). Both read the doctrees and the execution cache of
## `make docs`, so no chapter runs twice; both are as strict as the site. The PDF's LaTeX log is then checked for
## undefined references, missing characters and overfull lines (docs/_ext/_latex_log.py).
pdf: $(DOCS_STAMP) tex
	$(PY) -m sphinx $(SPHINXOPTS) -b latex -d $(BUILD)/doctrees docs $(BUILD)/latex
	max_print_line=10000 $(MAKE) -C $(BUILD)/latex LATEXMKOPTS=-silent all-pdf
	$(PY) docs/_ext/_latex_log.py $(BUILD)/latex/attention_ref.log

epub: $(DOCS_STAMP) tex
	$(PY) -m sphinx $(SPHINXOPTS) -b epub -d $(BUILD)/doctrees docs $(BUILD)/epub

docs-clean:
	rm -rf docs/_build

## The chapters as notebooks in notebooks/, which the Binder and Colab links open (commit them after a change).
## Made from the built book's downloadable notebooks (the glued numbers exist once the chapters have run).
notebooks: docs
	$(PY) docs/_ext/_launch_notebooks.py

$(LIVE_STAMP): pyproject.toml $(LOCK)/live.txt $(DOCS_STAMP)
	$(PIP) -e '.[docs,live]' -c $(LOCK)/live.txt
	@touch $@

## The book (built first if anything changed) on http://127.0.0.1:$(PORT)/, with a Jupyter kernel server behind it
## for the pages' "Live code" button (one TCP port, loopback only; the kernel server on a private Unix socket, reached
## through the book server's session check). Ctrl-C stops both.
PORT ?= 8000
serve: $(LIVE_STAMP) docs
	$(PY) docs/_ext/_live_server.py --port $(PORT) $(BUILD)/html

## Every test: unit, property, conformance, doctests, the strict book build and the browser tests.
## One pytest worker per core, with work stealing: an idle worker takes half of a busy one's queue, and
## tests/conftest.py puts the longest tests first, so the workers finish within seconds of each other.
## (On 2 cores, run alternately: 2 workers 142 and 144 s, 273 CPU-seconds each; 3 workers 145 and 153 s,
## 286 and 301 CPU-seconds, the extra browser and its contention costing more than the idle time it fills.)
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
test: $(TEST_STAMP) docs chromium tex
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

## Only the package's tests and doctests (no book, no browser, no wheel in a fresh environment).
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -n auto -m "not docs and not browser and not wheel"

lint: $(TEST_STAMP)
	$(PY) -m ruff check attention_ref tests benchmarks docs
	$(PY) -m mypy

bench: $(TEST_STAMP) bench-checks
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) benchmarks/run.py --write benchmarks/results.json

## What a check of attention_ref.testing costs, beside its GEMM floor and PyTorch's reference (a few minutes).
bench-checks: $(TEST_STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) benchmarks/check_speed.py --write benchmarks/check_speed.json

## The oracle shapes only (no long runs, best of 3), printed, not recorded: under a minute.
bench-quick: $(TEST_STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) benchmarks/run.py --quick

## Debian's Chromium for the browser tests (Playwright's own download does not work offline), and the tools
## tests/test_live.py probes `make serve` with as another local user would (setpriv, ss, curl).
chromium:
	@if [ -x /usr/bin/chromium ] && command -v setpriv ss curl >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium util-linux \
			iproute2 curl >/dev/null) \
		|| echo "warning: could not install chromium; browser tests will skip (or fail in CI)"; \
	else echo "note: /usr/bin/chromium, setpriv, ss or curl missing and not root; browser tests will skip"; fi

## Debian's TeX Live and fonts for `make pdf` (latexmk, XeLaTeX, xindy, DejaVu), latex and dvisvgm for the EPUB's
## equations, and the tools tests/test_pdf_epub.py reads both with (poppler-utils, epubcheck, tesseract-ocr).
TEX_PACKAGES := latexmk texlive-xetex texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended \
	tex-gyre fonts-freefont-otf fonts-dejavu-core xindy dvisvgm poppler-utils epubcheck tesseract-ocr
TEX_TOOLS := latexmk xelatex xindy dvisvgm pdftotext pdftoppm epubcheck tesseract
tex:
	@missing=; for tool in $(TEX_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -z "$$missing" ] && [ -n "$$(fc-list 'DejaVu Sans Mono' 2>/dev/null)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(TEX_PACKAGES) >/dev/null) \
		|| echo "warning: could not install TeX Live; make pdf fails and the PDF/EPUB tests skip (or fail in CI)"; \
	else echo "note: missing$$missing (not root); install: apt-get install $(TEX_PACKAGES)"; fi

## The lock. Each file pins a set of extras for Python 3.11; live.txt and test.txt are resolved within the one
## before them, so the three agree on every package they share. docs.txt and live.txt hold for any platform (Read
## the Docs, Binder, a reader's laptop); test.txt is this Linux x86-64 machine's Python (the venv's, where the
## universal files fork on the patch release), with PyTorch's CPU build.
## `make lock` re-resolves after a change to pyproject.toml, keeping every pin it can; `make upgrade-deps` moves
## every pin to the newest release, then rebuilds the committed notebooks and runs every test: commit the result
## (requirements/, notebooks/) as one reviewed change.
UV_COMPILE = $(VENV)/bin/uv pip compile -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) \
	--custom-compile-command 'make upgrade-deps' $(UPGRADE)
lock: | $(PY)
	$(PIP) -r $(LOCK)/tools.txt
	$(UV_COMPILE) --universal --python-version 3.11 $(LOCK)/tools.in -o $(LOCK)/tools.txt
	$(UV_COMPILE) --universal --python-version 3.11 pyproject.toml --extra docs -o $(LOCK)/docs.txt
	$(UV_COMPILE) --universal --python-version 3.11 pyproject.toml --extra docs --extra live -c $(LOCK)/docs.txt -o $(LOCK)/live.txt
	$(UV_COMPILE) pyproject.toml $(LOCK)/torch.in --extra test --extra docs --extra browser --extra live \
		--python $(PY) -c $(LOCK)/live.txt -o $(LOCK)/test.txt

upgrade-deps:
	$(MAKE) lock UPGRADE=--upgrade
	$(MAKE) notebooks
	$(MAKE) test

clean: docs-clean
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .mypy_cache
