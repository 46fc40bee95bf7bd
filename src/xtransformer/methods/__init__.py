"""The methods, one package each, and the registry that names them.

A method is a subclass of :class:`~xtransformer.methods.base.XMCModel` with ``fit``, ``predict``,
``save`` and ``load``. The suite's own are listed in :data:`METHODS`; another installed package adds
one with an entry point in the group ``xtransformer.methods`` (``name = "module:Class"``;
``examples/plugin_method`` is one), and ``python train.py method=<name>`` then trains it. Entries
are import paths, so loading an XR-Linear folder never imports torch.
"""

from __future__ import annotations

import functools
import importlib
import logging
from pathlib import Path

from xtransformer.model.folder import ModelError

log = logging.getLogger(__name__)

ENTRY_POINTS = "xtransformer.methods"  # the entry-point group of methods from other packages
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


@functools.cache
def plugin_methods() -> dict[str, str]:
    """The methods installed packages register (entry-point group ``xtransformer.methods``): name ->
    "module:Class". A name the suite has already is left out, with a warning naming the package."""
    from importlib.metadata import entry_points

    out: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        where = ep.dist.name if ep.dist is not None else "an installed package"
        if ep.name in METHODS or ep.name in COMBINATIONS:
            log.warning("%s registers the method %r, which xtransformer has: ignored", where, ep.name)
            continue
        out[ep.name] = ep.value
    return out


def trainable() -> dict[str, str]:
    """Every method a run can train: the suite's own, then those of installed packages."""
    return {**METHODS, **plugin_methods()}


def method_class(name: str, where: Path | str | None = None) -> type:
    """The class registered as ``name``; an unknown name, or a plugin that does not import, fails in
    one line (naming ``where``)."""
    target = METHODS.get(name) or COMBINATIONS.get(name) or plugin_methods().get(name)
    prefix = f"{where}: " if where is not None else ""
    if target is None:
        raise ModelError(
            f"{prefix}unknown model kind {name!r}; this xtransformer knows {sorted([*trainable(), *COMBINATIONS])} "
            f"(another package's method needs that package installed)"
        )
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as err:
        if name in METHODS or name in COMBINATIONS:
            raise
        raise ModelError(f"{prefix}method {name!r} ({target}, an entry point of {ENTRY_POINTS}): {err}") from None


__all__ = ["COMBINATIONS", "ENTRY_POINTS", "METHODS", "method_class", "plugin_methods", "trainable"]
