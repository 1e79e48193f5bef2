"""Load-time guards for the few places where a local extension relies on another package's internals.

An extension that replaces or calls a private function checks, when Sphinx loads it, that the function is
still there with the parameters it was written against, and stops the build with a message naming the
package, its installed version and what changed. A newer release then fails loudly at once instead of
producing a subtly different site.
"""

from __future__ import annotations

import inspect
from importlib import metadata

from sphinx.errors import ExtensionError


def require(extension: str, obj: object, name: str, parameters: tuple[str, ...], distribution: str):
    """Return ``getattr(obj, name)`` after checking that it exists and takes `parameters` first, in order.

    Raises `sphinx.errors.ExtensionError` naming `extension` and the installed version of `distribution`
    otherwise.
    """
    version = metadata.version(distribution)
    found = getattr(obj, name, None)
    where = f"{getattr(obj, '__name__', type(obj).__name__)}.{name}"
    if not callable(found):
        raise ExtensionError(f"{extension}: {distribution} {version} has no {where}; this extension needs updating")
    names = tuple(inspect.signature(found).parameters)[: len(parameters)]
    if names != parameters:
        raise ExtensionError(
            f"{extension}: {distribution} {version} changed {where}: parameters {names}, expected {parameters};"
            " this extension needs updating"
        )
    return found
