"""Execute the chapters a build must run side by side, one kernel per core, with encrypted kernel channels.

Corrects two things about how MyST-NB (``nb_execution_mode = "cache"``) executes notebooks:

* **One after another.** Sphinx reads documents in turn and MyST-NB executes each notebook as it reads it
  (Sphinx's parallel mode, ``-j``, makes no difference: it hands out neighbouring documents in batches and
  the chapters sit in one batch). Here, before Sphinx reads anything, the notebooks missing from the
  jupyter cache are read the way MyST-NB reads them and executed side by side into the cache; MyST-NB then
  finds every one of them there, exactly as in a warm build. A notebook that fails is left out of the cache,
  so MyST-NB runs it again itself and reports the failure, naming the chapter and the cell, as usual.
* **A warning per kernel.** ipykernel 7.3 and newer log "Kernel is running over TCP without encryption" to
  the build's output for every kernel started over TCP without CurveZMQ keys, which is what jupyter-client
  does by default. The kernels started here use ipykernel's documented remedy: the kernel manager provisions
  CurveZMQ keys (``transport_encryption = "auto"``) when the kernel's spec says it supports them.

Relies on MyST-NB's notebook reader (``myst_nb.core.read.create_nb_reader``) and jupyter-cache's executor
(``jupyter_cache.executors.utils.single_nb_execution``), checked at load time (see ``_upstream``). Verified
with Sphinx 9.0.4, MyST-NB 1.4.0, jupyter-cache 1.0.1, nbclient 0.11.0, jupyter-client 8.10.0 and
ipykernel 7.4.0.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from tempfile import TemporaryDirectory

import zmq
from _upstream import require
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors import utils as executors
from jupyter_client.manager import KernelManager
from myst_nb.core import read
from sphinx.util import logging
from traitlets import default

logger = logging.getLogger(__name__)
create_nb_reader = require(__name__, read, "create_nb_reader", ("path", "md_config", "nb_config", "content"), "myst-nb")
single_nb_execution = require(
    __name__, executors, "single_nb_execution", ("nb", "cwd", "timeout", "allow_errors"), "jupyter-cache"
)


class EncryptedKernelManager(KernelManager):
    """jupyter-client's kernel manager, provisioning CurveZMQ keys whenever the kernel supports them."""

    @default("transport_encryption")
    def _transport_encryption_default(self):
        return "auto" if zmq.has("curve") else "disabled"


def _missing_notebooks(env, docnames):
    """``(path, notebook, read format)`` of each document in `docnames` that is a notebook not in the cache."""
    config = env.mystnb_config
    cache = get_cache(config.execution_cache_path)
    missing = []
    for docname in sorted(docnames):
        path = Path(env.doc2path(docname))
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), env.myst_config, config, text)
        if reader is None:  # plain Markdown, no code to run
            continue
        notebook = reader.read(text)
        own = notebook.metadata.get(config.metadata_key, {})  # a notebook's own settings, as MyST-NB applies them
        if own.get("execution_mode", config.execution_mode) != "cache":
            continue
        try:
            cache.match_cache_notebook(notebook)
        except KeyError:
            missing.append((path, notebook, reader.read_fmt))
    return cache, missing


def execute_missing_chapters(app, env, docnames):
    """Run the notebooks missing from the jupyter cache side by side and store those that succeed in it."""
    config = env.mystnb_config
    if config.execution_mode != "cache":
        return
    cache, missing = _missing_notebooks(env, docnames)
    if not missing:
        return

    def execute(item):
        path, notebook, _ = item
        with TemporaryDirectory() if config.execution_in_temp else nullcontext(str(path.parent)) as cwd:
            return single_nb_execution(
                notebook,
                cwd=cwd,
                timeout=config.execution_timeout,
                allow_errors=config.execution_allow_errors,
                kernel_manager_class=EncryptedKernelManager,
            )

    threads = min(os.cpu_count() or 1, len(missing))
    logger.info("executing %d notebooks on %d cores", len(missing), threads)
    with ThreadPoolExecutor(threads) as pool:  # the kernels are processes; the threads only wait for them
        results = list(pool.map(execute, missing))
    for (path, notebook, read_fmt), result in zip(missing, results, strict=True):
        if result.err is None:  # as MyST-NB caches a notebook it executed itself
            staged = cache.add_nb_to_project(str(path), read_data=read_fmt)
            bundle = CacheBundleIn(notebook, staged.uri, data={"execution_seconds": result.time})
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)


def setup(app):
    app.setup_extension("myst_nb")
    app.connect("env-before-read-docs", execute_missing_chapters)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
