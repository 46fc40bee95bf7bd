"""xtransformer: X-Transformer / XR-Transformer for extreme multi-label text classification."""

__version__ = "0.1.0"
