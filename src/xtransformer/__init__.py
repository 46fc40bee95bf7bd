"""xtransformer: X-Transformer / XR-Transformer for extreme multi-label text classification.

    from xtransformer import XRLinear, XMCModel
    model = XRLinear.fit(texts, labels)        # labels: lists of label ids, or a sparse N x L matrix
    model.save("my-model")
    XMCModel.load("my-model").predict(["a new document"], k=5)

Names load on first use: predicting with a linear model imports neither torch nor Lightning.
"""

# the one place the version is written: pyproject.toml reads it from here (tool.setuptools.dynamic)
__version__ = "0.2.0"

_EXPORTS = {
    "XMCModel": "xtransformer.methods.base",
    "XRLinear": "xtransformer.methods.xrlinear",
    "XTransformer": "xtransformer.methods.xtransformer",
    "XRTransformer": "xtransformer.methods.xrtransformer",
    "KimCNN": "xtransformer.methods.cnn",
    "XMLCNN": "xtransformer.methods.cnn",
    "Combination": "xtransformer.methods.combination",
    "TrainContext": "xtransformer.context",
    "TrainerConfig": "xtransformer.context",
    "StageCache": "xtransformer.cache",
    "LabeledData": "xtransformer.data.inputs",
    "load_dataset": "xtransformer.data.dataset",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
