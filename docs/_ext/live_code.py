"""Live code: a "Live code" button on each chapter turns its code cells into editable cells run by a real kernel.

Adds what sphinx-book-theme's own Thebe support would, without its costs: the theme's "Live Code" launch button
(``launch_buttons["thebe"]``) loads Thebe and its dependencies from a CDN when the page opens, and sits in the
launch menu only when a repository is configured. Here the button is in every notebook page's header, the
client is the book's own small script (``_static/live_code.js``, no third-party code), and nothing is fetched
until the reader presses the button. The kernel then comes from, in order:

* the server ``make serve`` runs (``_live_server.py``): the page asks it for ``_live/config.json``, which
  exists only while that server runs and answers only a tab that opened the server's one-time link (written into
  a private page whose ``file://`` address the terminal shows; the script trades the key in the link's fragment
  for a session kept in the tab's ``sessionStorage`` and sent
  in a header, or as a WebSocket subprotocol: no cookie, which a browser would also send to every other port of
  the host); the kernels are then reached through that server (``_live/api/kernels``), which holds the kernel
  server's token, so the page never does; the page's kernel is deleted when the page goes away; in a page framed
  by another the script uses no key or session;
* Binder, when the build knows the repository (see below): the page asks Binder to start the repository;
* nothing: the page then says so, and how to get a kernel, in the status line under the button.

Repository: the config value ``live_code_repository``, else the environment variable
``ATTENTION_REF_REPOSITORY``, else ``READTHEDOCS_GIT_CLONE_URL`` (set by Read the Docs at build time), else the
``Repository`` entry of ``[project.urls]`` in pyproject.toml; its branch from ``live_code_branch``,
``ATTENTION_REF_BRANCH`` or ``READTHEDOCS_GIT_IDENTIFIER`` (default ``main``). A GitHub or GitLab repository
turns on the theme's launch menu (``repository_url``, ``path_to_docs``, ``repository_branch`` and
``launch_buttons``) with Binder for every chapter and Colab for GitHub. Corrects where that menu's links point
for the book's MyST Markdown chapters: at the chapter's source, which Colab cannot open and Binder shows as text.
Both links open the chapter's committed notebook instead, ``notebooks/<page>.ipynb`` (``_launch_notebooks``), and
a page without one gets neither link. ``notebook_download`` writes the downloadable notebooks after the theme's
launch code, which would otherwise overwrite them with MyST-NB's raw copies.

Public API only: configuration values, ``config-inited``, ``builder-inited`` and ``html-page-context`` (after
the theme's header and launch buttons, priority 502), and the theme's documented ``header_buttons`` context
list. Verified with Sphinx 9.0.4, sphinx-book-theme 1.4.0 and pydata-sphinx-theme 0.20.0.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

from _builders import is_website
from sphinx.util import logging

logger = logging.getLogger(__name__)

BINDERHUB = "https://mybinder.org"
COLAB = "https://colab.research.google.com"
PROVIDERS = {"github.com": "github", "gitlab.com": "gitlab"}
ROOT = Path(__file__).resolve().parents[2]
# Where the committed notebooks of the chapters are, relative to the repository's root (see _launch_notebooks).
NOTEBOOKS = "notebooks"


def repository_parts(url: str):
    """``(web URL, provider, org, repo)`` of a GitHub or GitLab clone URL (https or ssh), or None for other hosts."""
    url = url.strip()
    ssh = re.fullmatch(r"(?:ssh://)?git@([^:/]+)[:/](.+)", url)
    if ssh:
        url = f"https://{ssh.group(1)}/{ssh.group(2)}"
    match = re.fullmatch(r"https?://(?:[^@/]+@)?([^/]+)/([^/]+)/([^/]+?)(?:\.git)?/?", url)
    if not match or match.group(1).lower() not in PROVIDERS:
        return None
    host, org, repo = match.groups()
    return f"https://{host.lower()}/{org}/{repo}", PROVIDERS[host.lower()], org, repo


def hosted_options(repository: str, branch: str, path_to_docs: str = "docs", binderhub: str = BINDERHUB):
    """Theme options and the live-code Binder settings for `repository`, or ``({}, None)`` if it is unknown or
    not on GitHub or GitLab."""
    parts = repository_parts(repository) if repository else None
    if parts is None:
        return {}, None
    web, provider, org, repo = parts
    launch = {"binderhub_url": binderhub, "notebook_interface": "jupyterlab"}
    if provider == "github":
        launch["colab_url"] = COLAB
    theme = {
        "repository_url": web,
        "repository_provider": provider,
        "repository_branch": branch,
        "path_to_docs": path_to_docs,
        "launch_buttons": launch,
    }
    spec = f"gh/{org}/{repo}/{branch}" if provider == "github" else f"gl/{org}%2F{repo}/{branch}"
    return theme, {"url": binderhub.rstrip("/"), "spec": spec, "path_to_docs": path_to_docs.strip("/")}


def configured_repository(repository="", branch=""):
    """``(web URL or None, branch)`` of the book's repository: `repository` and `branch` if given, else from the
    environment (``ATTENTION_REF_*``, then Read the Docs' ``READTHEDOCS_GIT_*``), else pyproject.toml's
    ``[project.urls] Repository``."""
    env = os.environ
    repository = repository or env.get("ATTENTION_REF_REPOSITORY") or env.get("READTHEDOCS_GIT_CLONE_URL")
    if not repository and (ROOT / "pyproject.toml").is_file():
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
        repository = project.get("urls", {}).get("Repository", "")
    branch = branch or env.get("ATTENTION_REF_BRANCH") or env.get("READTHEDOCS_GIT_IDENTIFIER") or "main"
    parts = repository_parts(repository) if repository else None
    if repository and parts is None:
        logger.info("live_code: %s is not a GitHub or GitLab repository: no Binder or Colab links", repository)
    return (parts[0] if parts else None), branch


def configure_repository(app, config):
    """Turn on the theme's launch menu when the repository is known (and the theme options do not name one)."""
    repository, branch = configured_repository(config.live_code_repository, config.live_code_branch)
    theme, binder = hosted_options(repository, branch, config.live_code_path_to_docs, config.live_code_binderhub)
    options = config.html_theme_options
    if theme and not options.get("repository_url"):
        options.update(theme)
    app.live_code_settings = {"binder": binder}  # handed to the pages when the builder starts


def add_client(app):
    if not is_website(app.builder):
        return
    settings = json.dumps(getattr(app, "live_code_settings", {"binder": None}), sort_keys=True)
    app.add_js_file(None, body=f"window.attentionRefLiveCodeConfig = {settings};")
    app.add_js_file("live_code.js", defer="defer")
    app.add_css_file("live_code.css")


def add_live_code_button(app, pagename, templatename, context, doctree):
    """The header's "Live code" button on notebook pages; the launch menu's links fixed for MyST chapters."""
    if "kernelspec" not in app.env.metadata.get(pagename, {}) or "header_buttons" not in context:
        return
    buttons = context["header_buttons"]
    buttons.insert(0, {
        "type": "javascript",
        "javascript": "attentionRefLiveCode.toggle(this)",
        "text": "Live code",
        "tooltip": "Edit and run this page's code cells",
        "icon": "fas fa-play",
        "label": "live-code",
    })
    source = app.env.doc2path(pagename)
    if source.suffix == ".ipynb":
        return  # the theme's links open the page's own notebook
    # The links end with the page's source in the repository (path_to_docs/<page>.md); the committed notebook
    # is notebooks/<page>.ipynb, found from the source folder's place in the repository.
    path_to_docs = app.config.html_theme_options.get("path_to_docs", "").strip("/")
    root = Path(app.srcdir).joinpath(*[".."] * len(Path(path_to_docs).parts)).resolve()
    in_repository = f"{path_to_docs}/{pagename}{source.suffix}".lstrip("/")
    notebook = f"{NOTEBOOKS}/{pagename}.ipynb"
    for group in [group for group in buttons if group.get("label") == "launch-buttons"]:
        group["buttons"] = [
            dict(button, url=button["url"].removesuffix(in_repository) + notebook)
            for button in group["buttons"]
            if (root / notebook).is_file() and button["url"].endswith(in_repository)
        ]
        if not group["buttons"]:
            buttons.remove(group)  # no menu rather than an empty one


def setup(app):
    app.add_config_value("live_code_repository", "", "html", str)
    app.add_config_value("live_code_branch", "", "html", str)
    app.add_config_value("live_code_path_to_docs", "docs", "html", str)
    app.add_config_value("live_code_binderhub", BINDERHUB, "html", str)
    app.connect("config-inited", configure_repository)
    app.connect("builder-inited", add_client)
    app.connect("html-page-context", add_live_code_button, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
