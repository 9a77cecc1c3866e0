"""captioner: image captioning with sparse and structured visual attention.

The attention mappings live in :mod:`captioner.attention` (no other project imports);
the model, decoding, Lightning module and commands build on them.
"""

from pathlib import Path

__version__ = "0.1.0"

# The YAML configs of the paper's and the demo's runs (a source checkout's configs/ folder).
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
