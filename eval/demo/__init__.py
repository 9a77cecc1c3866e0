"""``captioner demo``: the whole method on the embedded synthetic dataset; its folder and
options (:mod:`.folder`), its steps (:mod:`.steps`), the trainings it reuses after a stop
(:mod:`.trainings`) and its comparison figure (:mod:`.metrics_figure`)."""
