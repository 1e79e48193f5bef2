"""Give citations an ARIA role that assistive technology (and axe-core) accepts.

Corrects: docutils gives each citation (numpydoc's References sections) the deprecated DPUB role
``doc-biblioentry`` inside a ``role="list"`` container; axe reports both aria-deprecated-role and
aria-required-children. The role becomes ``listitem``, in each page's body as the HTML builder hands it to
the template.

Public API only (the ``html-page-context`` event). Verified with Sphinx 9.0.4 and docutils 0.22.
"""

from __future__ import annotations


def fix_citation_roles(app, pagename, templatename, context, doctree):
    if "body" in context:
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def setup(app):
    app.connect("html-page-context", fix_citation_roles)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
