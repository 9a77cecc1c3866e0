"""Self-contained HTML pages (the rating kit, the attention gallery): a template of
``eval/templates`` with its data, script and style inline, so the page works from ``file://``
without a network."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup


@cache
def _environment() -> Environment:
    """Jinja2 over ``eval/templates``, escaping every value put in an HTML template. The folder
    is found from the ``eval.templates`` package itself: Jinja2's PackageLoader looks up
    ``eval``, which in a working folder holding an ``eval/`` (``captioner evaluate --out eval``)
    is that folder."""
    return Environment(loader=FileSystemLoader(str(resources.files("eval.templates"))),
                       autoescape=select_autoescape(["html"]), keep_trailing_newline=True)


def template(name: str) -> str:
    """The text of ``eval/templates/NAME``."""
    return resources.files("eval.templates").joinpath(name).read_text(encoding="utf-8")


def render_page(page: str, data: dict, title: str) -> str:
    """``PAGE.html`` (which includes ``page_head.html``: doctype, security policy, title,
    style) with ``PAGE.css`` as its style, ``common.js`` and ``PAGE.js`` as its script, and
    the title and ``data`` inline. Jinja2 escapes the title for HTML, and its ``tojson`` filter
    writes the data with no ``<``, ``>``, ``&`` or ``'`` left literal, so no caption or file
    name can close the data's ``<script>`` element. The style and the scripts are the
    package's own files, put in as they are."""
    return _environment().get_template(f"{page}.html").render(
        title=title,
        data=data,
        style=Markup(template(f"{page}.css")),
        script=Markup(template("common.js") + template(f"{page}.js")),
    )


def page_files(page: Path) -> set[str]:
    """The files that a page written by :func:`render_page` shows, as its data (the JSON in
    the template's one ``<script type="application/json">``) lists
    them, relative to its folder: every image's ``src``, every word's ``overlay`` and the
    ``colorbar`` (a gallery's). An empty set when the page or its data cannot be read, so that
    nothing the page does not list is taken for its own."""
    try:
        text = page.read_text(encoding="utf-8")
        found = re.search(r'<script id="[^"]*" type="application/json">(.*?)</script>', text,
                          re.DOTALL)
        data = json.loads(found.group(1)) if found else {}
        images = data.get("images", [])
        overlays = [word["overlay"] for image in images for caption in image["captions"]
                    for word in caption["words"]]
        return {*(image["src"] for image in images), *overlays,
                *([data["colorbar"]] if "colorbar" in data else [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
