"""xtransformer: X-Transformer / XR-Transformer for extreme multi-label text classification."""

__version__ = "0.1.0"

from xtransformer import resolvers as _resolvers

_resolvers.register()
