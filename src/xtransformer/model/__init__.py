"""Portable model folders: save a run's models, load them anywhere, predict.

``folder.py`` (manifest, checksums, format version), ``tfidf_io.py`` (the vectoriser as data),
``methods.py`` (one predictor per method kind), ``api.py`` (:class:`XMCModel`), ``export.py``
(:func:`save_run_models`, called by the pipeline at the end of a run).
"""

from xtransformer.model.api import XMCModel
from xtransformer.model.folder import FORMAT_VERSION, ModelError

__all__ = ["FORMAT_VERSION", "ModelError", "XMCModel", "save_run_models"]


def __getattr__(name: str):
    # the writer pulls in omegaconf / the pipeline's helpers: not needed to predict
    if name == "save_run_models":
        from xtransformer.model.export import save_run_models

        return save_run_models
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
