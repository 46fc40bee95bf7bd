"""xtransformer: X-Transformer / XR-Transformer for extreme multi-label text classification."""

__version__ = "0.1.0"

from xtransformer import resolvers as _resolvers

_resolvers.register()


def __getattr__(name: str):
    # `from xtransformer import XMCModel` without importing the training stack
    if name == "XMCModel":
        from xtransformer.model import XMCModel

        return XMCModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
