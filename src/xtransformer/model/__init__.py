"""The portable model folder: its manifest, checksums and format version (``folder.py``), and the
folder on the Hugging Face Hub: ``hf://`` addresses, pushes and the model card (``hub.py``, ``card.py``).

``XMCModel`` (``xtransformer.methods.base``) writes and reads these folders; it is re-exported
here and at the package's top level for ``from xtransformer.model import XMCModel``.
"""

from __future__ import annotations

from xtransformer.model.folder import FORMAT_VERSION, ModelError

__all__ = ["FORMAT_VERSION", "ModelError", "XMCModel"]


def __getattr__(name: str):
    if name == "XMCModel":  # the methods' base class; loading it imports no training stack
        from xtransformer.methods.base import XMCModel

        return XMCModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
