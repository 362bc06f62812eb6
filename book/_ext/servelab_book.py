"""Sphinx tweaks for the servelab book, loaded through _config.yml's local_extensions.

sphinx-thebe (always loaded by Jupyter Book 1) registers an inline script that
declares ``const THEBE_JS_URL``; in this stack it ends up twice on every page and the
browser logs "Identifier 'THEBE_JS_URL' has already been declared". The book has no
live-kernel buttons (readers run notebooks in JupyterLab instead), so we drop thebe's
scripts from every page rather than filter the error. We also refuse, at build time,
any script or stylesheet that would be fetched from the network: the book must work
from disk.

Chapters point readers to their exercise with a plain relative link,
``[exercise](../exercises/ex11_seats.ipynb)``, which works in JupyterLab. The exercise
notebooks are not pages of the book, so MyST would report a missing document; we turn
such links into download links instead (the built book then ships a copy of the
notebook). A link to a notebook that does not exist is still an error.
"""
from __future__ import annotations

from pathlib import Path

from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

# Folders of notebooks that live beside the book but are not pages of it.
NOTEBOOKS_OUTSIDE_THE_BOOK = ("exercises/", "solutions/")


def _attr(asset, name, default=None):
    attributes = getattr(asset, "attributes", {}) or {}
    return attributes.get(name, default)


def _is_thebe(asset) -> bool:
    filename = str(getattr(asset, "filename", asset) or "")
    body = _attr(asset, "body", "") or ""
    return "thebe" in filename.lower() or "THEBE_JS_URL" in body


def _is_remote(asset) -> bool:
    filename = str(getattr(asset, "filename", asset) or "")
    return "://" in filename or filename.startswith("//")


def _clean_page_assets(app: Sphinx, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        assets = context.get(key)
        if not assets:
            continue
        kept = [a for a in assets if not _is_thebe(a)]
        remote = [str(getattr(a, "filename", a)) for a in kept if _is_remote(a)]
        if remote:
            raise ExtensionError(
                f"{pagename}: page would load {remote} from the network; vendor it under "
                "book/static/vendor (see tools/vendor_widgets.sh) and point the config at it"
            )
        assets[:] = kept


def _link_outside_notebooks_as_downloads(app: Sphinx, doctree) -> None:
    env = app.env
    for node in list(doctree.findall(addnodes.pending_xref)):
        if node.get("reftype") != "myst" or node.get("refdomain") != "doc":
            continue
        target = node.get("reftarget", "")
        if target in env.found_docs or not target.startswith(NOTEBOOKS_OUTSIDE_THE_BOOK):
            continue
        if not (Path(app.srcdir) / f"{target}.ipynb").is_file():
            continue  # leave it: MyST reports the broken link
        download = addnodes.download_reference(
            "", "", refdomain=None, reftype="myst", refexplicit=node.get("refexplicit", True),
            refdoc=node.get("refdoc", env.docname), reftarget=f"/{target}.ipynb",
            classes=["xref", "download", "myst"],
        )
        download.extend(child.deepcopy() for child in node.children)
        node.replace_self(download)


def setup(app: Sphinx):
    # Before Sphinx's download collector (priority 500) copies the linked files.
    app.connect("doctree-read", _link_outside_notebooks_as_downloads, priority=400)
    # Run after myst-nb and the theme have added their per-page files.
    app.connect("html-page-context", _clean_page_assets, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
