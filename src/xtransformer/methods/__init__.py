"""The methods, one package each, and the registry that names them.

A method is a subclass of :class:`~xtransformer.methods.base.XMCModel` with ``fit``, ``predict``,
``save`` and ``load``. Adding one takes a package here, a ``configs/method/<name>.yaml`` and one
line in :data:`METHODS` (docs/ARCHITECTURE.md, "How to add a method"). Entries are import paths,
so loading an XR-Linear folder never imports torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from xtransformer.model.folder import ModelError

# the methods a run trains: the config's `method` (and the manifest's components.kind) -> "module:Class"
METHODS: dict[str, str] = {
    "xrlinear": "xtransformer.methods.xrlinear:XRLinear",
    "xtransformer": "xtransformer.methods.xtransformer:XTransformer",
    "xrtransformer": "xtransformer.methods.xrtransformer:XRTransformer",
    "kimcnn": "xtransformer.methods.cnn:KimCNN",
    "xmlcnn": "xtransformer.methods.cnn:XMLCNN",
}
# model folders that are not trained by a run of their own: combinations of trained members
COMBINATIONS: dict[str, str] = {"ensemble": "xtransformer.methods.combination:Combination"}


def method_class(name: str, where: Path | str | None = None) -> type:
    """The class registered as ``name``; an unknown name fails in one line (naming ``where``)."""
    target = METHODS.get(name) or COMBINATIONS.get(name)
    if target is None:
        prefix = f"{where}: " if where is not None else ""
        raise ModelError(
            f"{prefix}unknown model kind {name!r}; this xtransformer knows {sorted([*METHODS, *COMBINATIONS])}"
        )
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["COMBINATIONS", "METHODS", "method_class"]
