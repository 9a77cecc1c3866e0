"""Inference: a trained checkpoint captions images with one attention map per word
(:mod:`.pipeline`, the Python API's ``Captioner``), and the outputs of ``captioner caption``
(:mod:`.captioning`) and ``captioner heatmaps`` (:mod:`.heatmap_folder`, drawn by
:mod:`.heatmaps`); image files named on a command line are read by :mod:`.image_files`."""
