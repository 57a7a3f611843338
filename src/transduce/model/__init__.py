"""The model of "Attention Is All You Need" (§3), one module per concept.

attention.py   — scaled dot-product and multi-head attention (§3.2)
feedforward.py — position-wise feed-forward networks (§3.3)
embeddings.py  — embeddings × √d_model and positional encodings (§3.4, §3.5)
layers.py      — encoder/decoder layers and residual connections (§3.1, §5.4)
transformer.py — the encoder–decoder stack and incremental decoding (§3)
cache.py       — keys/values kept between decoding steps
config.py      — ModelConfig and the presets of Table 3
"""

from .cache import DecoderCache
from .config import PRESETS, ModelConfig
from .transformer import Encoded, Transformer

__all__ = ["DecoderCache", "Encoded", "ModelConfig", "PRESETS", "Transformer"]
