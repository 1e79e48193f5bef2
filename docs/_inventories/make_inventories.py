"""Write the intersphinx inventories shipped with the book (``*.inv``) from ``*.txt``.

The book builds offline, so intersphinx never downloads ``objects.inv``:
``docs/conf.py`` points each mapping at a file in this folder. Each ``.txt``
file lists the external objects the book and the API docstrings refer to, one
per line (``name domain:role uri [display name]``, ``$`` in a uri standing for
the name), with the real address on the project's site. To link to something
new, add a line and run::

    .venv/bin/python docs/_inventories/make_inventories.py

The output is byte-for-byte reproducible (fixed zlib level, sorted entries).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, str, str, str]]]:
    """Return ``(header, entries)`` from an inventory listing."""
    header: dict[str, str] = {}
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() in {"project", "version", "base"}:
                header[key.strip()] = value.strip()
            continue
        parts = line.split(maxsplit=3)
        if len(parts) < 3 or ":" not in parts[1]:
            raise ValueError(f"line {lineno}: expected 'name domain:role uri [display]'; got {raw!r}")
        name, role, uri = parts[:3]
        display = parts[3] if len(parts) == 4 else "-"
        entries.append((name, role, uri, display))
    for key in ("project", "version"):
        if key not in header:
            raise ValueError(f"missing '# {key}: ...' header line")
    return header, sorted(set(entries))


def render(header: dict[str, str], entries) -> bytes:
    """Sphinx inventory format version 2: four text lines, then zlib-compressed entries."""
    head = (
        "# Sphinx inventory version 2\n"
        f"# Project: {header['project']}\n"
        f"# Version: {header['version']}\n"
        "# The remainder of this file is compressed using zlib.\n"
    ).encode()
    # The priority column: 1 for Python objects, -1 (hidden from search) for labels and terms.
    body = "".join(
        f"{name} {role} {1 if role.startswith('py:') else -1} {uri} {display}\n" for name, role, uri, display in entries
    ).encode()
    return head + zlib.compress(body, 9)


def main() -> int:
    for source in sorted(HERE.glob("*.txt")):
        header, entries = parse(source.read_text(encoding="utf-8"))
        target = source.with_suffix(".inv")
        target.write_bytes(render(header, entries))
        print(f"{target.name}: {len(entries)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
