// Helpers of the static pages of eval/templates (the gallery, the rating kit), inlined by
// eval.static_page.render_page before each page's own script, in the same script element.
"use strict";

// A new TAG element with the attributes ATTRS and the text TEXT: values and text are set as
// plain strings, never parsed as HTML.
function node(tag, attrs, text) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    element.setAttribute(name, String(value));
  }
  if (text !== undefined) {
    element.textContent = text;
  }
  return element;
}
