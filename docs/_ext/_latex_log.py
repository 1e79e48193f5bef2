"""Check the PDF's LaTeX log: the strictness ``sphinx -W`` gives the site, for the part of the build Sphinx hands to
latexmk.

latexmk stops on a LaTeX error but not on what LaTeX only logs: a character no font has (XeLaTeX prints nothing in
its place), a reference or citation left undefined ("??" on the page), or a line too long for the text block.
``make pdf`` runs this after latexmk; ``tests/test_pdf_epub.py`` uses :func:`problems` on the same log.

Usage: ``python docs/_ext/_latex_log.py docs/_build/latex/attention_ref.log`` (exit status 1 and one line per
problem if there are any). Run latexmk with ``max_print_line=10000`` (the Makefile does) so that no message is
wrapped across lines of the log.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: An overfull line of body text this many points (or fewer) too wide is invisible in print; wider ones are
#: reported.
OVERFULL_PT = 3.0
#: A table cell may overrun its column by this much (into the gap beside it, never past the page's margin): a
#: ten-column table of numbers has columns a few digits wide. Wider ones are reported.
TABLE_OVERFULL_PT = 20.0
TABLE_END = re.compile(r"^\\end\{(?:tabulary|tabular|longtable)\}")

MISSING_CHARACTER = re.compile(r"^Missing character: .*$", re.MULTILINE)
UNDEFINED = re.compile(
    r"^(?:LaTeX|Package \w+) Warning: (?:Reference|Citation|Hyper reference) .* undefined.*$"
    r"|^LaTeX Warning: There were undefined references\.$"
    r"|^LaTeX Font Warning: Font shape .* undefined.*$",
    re.MULTILINE,
)
OVERFULL = re.compile(
    r"^Overfull \\hbox \((?P<points>[\d.]+)pt too wide\) (?:in paragraph at lines \d+--|detected at line )"
    r"(?P<line>\d+)$",
    re.MULTILINE,
)


def problems(log: str, tex: str = "") -> list[str]:
    """Each line of the LaTeX `log` that reports a missing character, an undefined reference, citation or font
    shape, or a line wider than its box: by more than :data:`OVERFULL_PT` in the text, or more than
    :data:`TABLE_OVERFULL_PT` in a table cell (a box the log places on the line of the `tex` source that ends a
    table)."""
    lines = tex.splitlines()
    found = [match.group(0) for match in MISSING_CHARACTER.finditer(log)]
    found += [match.group(0) for match in UNDEFINED.finditer(log)]
    for match in OVERFULL.finditer(log):
        line = int(match.group("line"))
        in_table = 0 < line <= len(lines) and TABLE_END.match(lines[line - 1].strip())
        if float(match.group("points")) > (TABLE_OVERFULL_PT if in_table else OVERFULL_PT):
            found.append(match.group(0))
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    tex = path.with_suffix(".tex")
    found = problems(path.read_text(encoding="utf-8", errors="replace"),
                     tex.read_text(encoding="utf-8") if tex.is_file() else "")
    for line in found:
        print(f"{path}: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
