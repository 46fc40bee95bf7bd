"""Linear rankers: negatives (TFN/MAN), batched OVA solver, XR-Linear and its forests, post-processors."""

from xtransformer.ranker.config import HierarchicalLinearConfig, RankerConfig
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.features import concat_features
from xtransformer.ranker.forest import LinearForest, load_tree_model
from xtransformer.ranker.hierarchical import HierarchicalLinear, level_targets
from xtransformer.ranker.level import LinearLevel
from xtransformer.ranker.linear import LinearRanker
from xtransformer.ranker.negatives import SCHEMES, binarize, negative_mask, tfn_mask
from xtransformer.ranker.postprocess import POST_PROCESSORS, PostProcessor, get_post_processor
from xtransformer.ranker.solver import SolverParams
from xtransformer.ranker.train import ranker_features, train_ranker
from xtransformer.topk import topk_csr

__all__ = [
    "HierarchicalLinear",
    "HierarchicalLinearConfig",
    "LinearForest",
    "LinearLevel",
    "LinearRanker",
    "POST_PROCESSORS",
    "PostProcessor",
    "RankerConfig",
    "RankerError",
    "SCHEMES",
    "SolverParams",
    "binarize",
    "concat_features",
    "get_post_processor",
    "level_targets",
    "load_tree_model",
    "negative_mask",
    "ranker_features",
    "tfn_mask",
    "topk_csr",
    "train_ranker",
]
