"""XR-Linear: TF-IDF -> a label tree -> a linear one-vs-all model per tree level, beam search.

PECOS's ``XLinearModel`` recipe (PIFA tree of balanced k-means, squared-hinge rankers on
teacher-forced negatives, the l3-hinge path product), optionally over several trees (a forest)
and a disentangled leaf level. It reads TF-IDF rows only, so it also trains and predicts on given
feature rows (XC / npz data). Importing it never imports torch.
"""

from xtransformer.methods.xrlinear.config import XRLinearConfig, XRLinearSettings
from xtransformer.methods.xrlinear.model import XRLinear, fit_tree_model, index_section

__all__ = ["XRLinear", "XRLinearConfig", "XRLinearSettings", "fit_tree_model", "index_section"]
