"""No code block or printed output scrolls sideways at 1280 px: every line a reader is shown fits its block.

``tests/test_site.py`` measures the code cells' input; this measures every ``pre`` block a book page shows (code
cells' input and output, code blocks in the prose, included files) on the pages ``test_site.SCREEN_PAGES`` lists
(the landing page, the chapters and the reference pages; the API pages' doctest examples are not measured here),
the way Chromium lays it out: a block overflows when its ``scrollWidth`` exceeds its ``clientWidth``, and each of
its lines wider than the block is reported with its page and whether it is code or output. The tab is
``test_site``'s: Debian's Chromium through Playwright, 1280 px wide, the system's fonts (the theme's monospace
stack ends in ``monospace``, which is DejaVu Sans Mono on Debian). Every fold is opened first (a folded cell's input
or output, a dropdown admonition, a solution: each a ``<details>``), since a reader who opens one reads what is in it.

Without a built site or without ``/usr/bin/chromium`` the tests skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

from urllib.parse import urljoin

import pytest
from test_site import SCREEN_PAGES, SITE, _missing, site, tab  # noqa: F401 (site, tab: fixtures)

pytestmark = pytest.mark.browser

# Each shown `pre` block whose content is wider than the block, with the lines that do not fit (measured with the
# block's own font on a canvas), once every fold of the article is open.
_OVERFLOWING = """() => {
  for (const fold of document.querySelectorAll('article.bd-article details')) fold.open = true;
  const shown = e => e.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true});
  const canvas = document.createElement('canvas').getContext('2d');
  const found = [];
  for (const pre of [...document.querySelectorAll('article.bd-article pre')].filter(shown)) {
    if (pre.scrollWidth <= pre.clientWidth + 1) continue;
    const style = getComputedStyle(pre);
    canvas.font = style.font;
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const lines = pre.textContent.split('\\n').filter(line => canvas.measureText(line).width > room + 1);
    const where = pre.closest('.cell_output') ? 'output' : pre.closest('.cell_input') ? 'code cell' : 'code block';
    found.push({where, folded: pre.closest('details') !== null,
                lines: lines.length ? lines : ['(the block scrolls sideways)']});
  }
  return found;
}"""


def overflowing(page):
    """The overflowing blocks of the page open in `page` (a Playwright page): ``[{where, font, lines}, ...]``."""
    return page.evaluate(_OVERFLOWING)


def _report(page_path, blocks):
    return "\n".join(f"{page_path} ({block['where']}{', folded' if block['folded'] else ''}): {line}"
                     for block in blocks for line in block["lines"])


@pytest.mark.parametrize("page_path", SCREEN_PAGES)
def test_no_code_or_output_line_overflows_its_block(tab, site, page_path):  # noqa: F811 (fixtures)
    if not (SITE / page_path).is_file():
        _missing(f"{page_path} in the built book")
    blocks = overflowing(tab.open(urljoin(site, page_path)).page)
    lines = sum(len(block["lines"]) for block in blocks)
    assert blocks == [], f"{lines} lines wider than their block at 1280 px:\n{_report(page_path, blocks)}"


# The self-tests widen an output block on the first of these pages that has one: the first a reader sees unfolded,
# and the first inside a fold (closed when the page opens).
_SELFTEST_PAGES = ("chapters/04_scaling.html", "chapters/06_causal_decoding.html", "chapters/performance.html")

_WIDEN_FIRST_OUTPUT = """folded => {
  const shown = e => e.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true});
  const pre = [...document.querySelectorAll('article.bd-article div.cell_output pre')]
    .find(e => (folded ? e.closest('details') && !e.closest('details').open && !shown(e) : shown(e)));
  if (!pre) return false;
  pre.textContent += '\\n' + 'wide = ' + '1.0, '.repeat(40);
  return true;
}"""


@pytest.mark.parametrize("folded", [False, True], ids=["shown", "folded"])
def test_selftest_an_overflowing_output_line_is_found(tab, site, folded):  # noqa: F811 (fixtures)
    for page_path in _SELFTEST_PAGES:
        page = tab.open(urljoin(site, page_path)).page
        if page.evaluate(_WIDEN_FIRST_OUTPUT, folded):
            break
    else:
        pytest.fail(f"none of {_SELFTEST_PAGES} has a {'folded' if folded else 'shown'} output block to widen")
    after = overflowing(page)
    widened = [block for block in after if any(line.startswith("wide = 1.0, 1.0") for line in block["lines"])]
    assert [block["where"] for block in widened] == ["output"]
