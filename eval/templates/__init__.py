"""Static assets of the human-rating kit and the attention gallery: page templates, scripts and
styles, inlined by `eval.static_page.render_page` so that the pages need no network and no
external files."""
