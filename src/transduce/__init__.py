"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from .config import ConfigError
from .model import ModelConfig, Transformer

__version__ = "0.1.0"

__all__ = ["ConfigError", "ModelConfig", "Transformer", "__version__"]
