"""Key MyST-NB's execution cache on the package source, and keep chapter execution reproducible.

Corrects: jupyter-cache (via MyST-NB's ``nb_execution_mode = "cache"``) keys an executed notebook on the
notebook's own text only, so editing ``attention_ref`` would leave every chapter showing outputs of the old
code. This extension points ``nb_execution_cache_path`` at ``<doctreedir>/jupyter_cache/<fingerprint>``, where
the fingerprint hashes the package source, the figure style, the explorable figures' package (``explorables``,
which chapter cells import), the benchmark record the Performance chapter reads, and the frameworks record
with the names and versions of the optional frameworks installed (the frameworks page runs live with them and
from the record without). Because ``nb_execution_cache_path`` is an
"env" config value, a new fingerprint also makes Sphinx re-read every document. Caches of older fingerprints
are removed, and each doctree folder has its own cache, so builds into different folders never share a database.

It also builds matplotlib's font cache before any chapter runs (on a fresh machine matplotlib announces that
build on stderr, which ``nb_output_stderr = "warn"`` turns into a build error), and keeps attention_ref's
kernels on one thread while chapters run, so the chapters that measure memory print the same numbers on every
build.

Public API only (the ``config-inited`` event and configuration values). Verified with Sphinx 9.0.4,
MyST-NB 1.4.0 and jupyter-cache 1.0.1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from attention_ref.records import DISPLAY_NAMES, installed_version

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent


def hash_files(paths) -> str:
    """Short hash of the existing files among `paths`: their names (relative to the repository) and contents."""
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


#: Optional frameworks a page runs live when they are installed and reads from a committed record otherwise
#: (the frameworks attention_ref.records names): installing, upgrading or removing one must re-execute those
#: pages (a record can ask for a least version, so the version counts too).
OPTIONAL_FRAMEWORKS = tuple(DISPLAY_NAMES)


def installed_frameworks() -> list[str]:
    """``name==version`` of each optional framework importable here."""
    versions = {name: installed_version(name) for name in OPTIONAL_FRAMEWORKS}
    return [f"{name}=={version}" if version else name for name, version in versions.items() if version is not None]


def source_fingerprint() -> str:
    """Hash of everything executed chapters depend on besides their own text."""
    files = hash_files([
        *sorted((ROOT / "attention_ref").glob("*.py")),
        DOCS / "chapters" / "matplotlibrc",
        ROOT / "benchmarks" / "results.json",  # read by the Performance chapter
        ROOT / "benchmarks" / "check_speed.json",  # read by the testing page (what a check costs)
        DOCS / "chapters" / "frameworks_record.json",  # read without torch and JAX (attention_ref.records)
        *sorted((DOCS / "_ext" / "explorables").glob("*.py")),  # the explorable figures the chapters' cells compute
    ])
    return hashlib.sha256(f"{files} {' '.join(installed_frameworks())}".encode()).hexdigest()[:16]


def configure_execution_cache(app, config):
    """Point jupyter-cache at ``<doctreedir>/jupyter_cache/<fingerprint>`` and drop older fingerprints' caches."""
    if config.nb_execution_cache_path:  # set explicitly (e.g. -D on the command line)
        return
    root = Path(app.doctreedir) / "jupyter_cache"
    fingerprint = source_fingerprint()
    if root.is_dir():
        for stale in root.iterdir():
            if stale.name != fingerprint:
                shutil.rmtree(stale, ignore_errors=True)
    config.nb_execution_cache_path = str(root / fingerprint)


def warm_matplotlib(app, config):
    """Build matplotlib's font cache in the Sphinx process, before any kernel imports matplotlib."""
    import matplotlib.font_manager  # noqa: F401


def setup(app):
    # Inherited by every kernel this build starts (chapters that measure memory must be deterministic).
    os.environ["ATTENTION_REF_NUM_THREADS"] = "1"
    app.connect("config-inited", configure_execution_cache)
    app.connect("config-inited", warm_matplotlib)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
