"""captioner: image captioning with sparse and structured visual attention.

The attention mappings live in :mod:`captioner.attention` (no other project imports);
the model, decoding, Lightning module and commands build on them.
"""

__version__ = "0.1.0"
