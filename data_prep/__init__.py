"""Dataset preparation: Karpathy splits, vocabulary, images, synthetic dataset, feature cache.

The lowest layer of the project: it imports nothing from ``captioner`` or ``eval``.
"""
