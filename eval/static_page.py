"""Self-contained HTML pages (the rating kit, the attention gallery): a template of
``eval/templates`` with its data, script and style inline, so the page works from ``file://``
without a network."""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path


def script_json(data: object) -> str:
    """JSON safe inside an HTML ``<script>`` element: no ``<``, ``>``, ``&`` or line
    separators survive literally, so no caption or file name can close the element."""
    text = json.dumps(data, ensure_ascii=False, sort_keys=True)
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


def template(name: str) -> str:
    """The text of ``eval/templates/NAME``."""
    return resources.files("eval.templates").joinpath(name).read_text(encoding="utf-8")


def render_page(page: str, data: dict, title: str) -> str:
    """``PAGE.html`` with ``page_head.html`` (doctype, security policy, title, ``PAGE.css``) in
    place of its ``{{HEAD}}``, ``common.js`` and ``PAGE.js`` as its ``{{SCRIPT}}``, and the title
    and ``data`` inline. The templates are assembled first; the title, style, scripts and data
    then go in in one substitution pass, so inserted text is never scanned for placeholders."""
    page_template = template(f"{page}.html").replace("{{HEAD}}", template("page_head.html"))
    parts = {
        "TITLE": html.escape(title),
        "STYLE": template(f"{page}.css"),
        "SCRIPT": template("common.js") + template(f"{page}.js"),
        "DATA": script_json(data),
    }
    return re.sub(
        r"\{\{(TITLE|STYLE|SCRIPT|DATA)\}\}", lambda m: parts[m.group(1)], page_template
    )


def page_files(page: Path) -> set[str]:
    """The files that a page written by :func:`render_page` shows, as its data (the JSON in
    the template's one ``<script type="application/json">``, where ``{{DATA}}`` goes) lists
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
