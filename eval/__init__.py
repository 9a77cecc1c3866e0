"""Evaluation: coco-caption metrics (SPICE included), REP, attention statistics, object
mentions, and the human-rating kit. The top layer: it may import ``captioner`` and
``data_prep``, never the other way round."""
