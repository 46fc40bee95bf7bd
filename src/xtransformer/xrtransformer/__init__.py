"""XR-Transformer (Zhang et al., NeurIPS 2021): the encoder fine-tuned level by level over the label
tree, coarse to fine, then a linear tree model on TF-IDF ⊕ the fine-tuned embeddings.

``config`` holds the settings, ``levels`` the tree / target / shortlist algebra (numpy, scipy),
``module`` one level's LightningModule, ``train`` the level loop and the embeddings, ``model`` the
final linear model's features. Importing ``train`` or ``module`` imports Lightning.
"""

from xtransformer.xrtransformer.config import FinalModelConfig, XRTransformerConfig, XRTransformerConfigError

__all__ = ["FinalModelConfig", "XRTransformerConfig", "XRTransformerConfigError"]
