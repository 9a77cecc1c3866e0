"""Static assets of the human-rating kit (HTML page, script, style), inlined by
`eval.rating_kit.render_page` so that the kit needs no network and no external files."""
