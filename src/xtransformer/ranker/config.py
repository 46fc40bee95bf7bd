"""Ranker settings: ``RankerConfig`` (the ``ranker`` config group's record) and ``HierarchicalLinearConfig``.

Solver defaults follow PECOS/LIBLINEAR (squared hinge by dual coordinate descent, Cp = Cn = 1,
bias 1, eps 0.1, at most 100 passes, prune |w| < 0.1). With ``loss="logistic"`` the solver is a
batched primal Newton-CG, and ``eps``/``max_iter`` mean its stopping rule (relative gradient norm,
Newton iterations; ``max_cg_iter`` CG steps each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.postprocess import POST_PROCESSORS
from xtransformer.settings import Settings, predict_field, run_field
from xtransformer.utils.hardware import available_cpus

FEATURES = ("tfidf", "tfidf+neural")
NEGATIVES = ("tfn", "man", "tfn+man")
LOSSES = ("squared_hinge", "logistic")
ADDED_REACH = ("beam", "all", "alone")
ADDED_NEGATIVES = ("leaf", "all")


@dataclass
class RankerConfig(Settings):
    """One level of one-vs-all linear rankers (the neural path's ranker)."""

    where = "ranker"
    error = RankerError

    name: str = run_field("tfidf_neural_tfn_man")  # label of the setting (the YAML file's name)
    features: str = "tfidf+neural"  # tfidf | tfidf+neural (concat_features)
    neural_weight: float = 1.0  # scale of the row-normalised neural block in concat_features
    negatives: str = "tfn+man"  # tfn | man | tfn+man (the paper's best)
    loss: str = "squared_hinge"  # squared_hinge | logistic
    Cp: float = 1.0  # cost of a positive instance
    Cn: float = 1.0  # cost of a negative instance
    bias: float = 1.0  # value of the appended bias feature; <= 0 disables it
    threshold: float = 0.1  # prune weights with |w| < threshold
    max_iter: int = 100  # squared hinge: dual CD passes per problem; logistic: Newton iterations
    eps: float = 0.1  # squared hinge: stop at max - min projected gradient <= eps; logistic: ||g|| <= eps ||g_0||
    max_cg_iter: int = 20  # logistic: conjugate-gradient steps per Newton iteration
    post_processor: str = predict_field("l3-hinge")  # noop | sigmoid | l1..l4-hinge | log-sigmoid | log-l1..l4-hinge
    # weight w of the matcher's score: t(ranker) * t(matcher)^w (w * t(matcher) for log- post-processors);
    # 1 = the paper, 0 = the ranker alone over the matcher's shortlist (prediction only, not trained)
    matcher_weight: float = predict_field(1.0)
    beam_size: int = predict_field(10)  # clusters kept per level during beam search (PECOS default 10)
    topk: int = predict_field(20)  # labels kept per document in the final predictions
    threads: int = run_field(0)  # worker threads for training and prediction; <= 0: every CPU available
    batch_nnz: int = 500_000  # clusters with fewer nonzeros of X are solved together in one block

    def check(self) -> None:
        for key, choices in (
            ("features", FEATURES),
            ("negatives", NEGATIVES),
            ("loss", LOSSES),
            ("post_processor", POST_PROCESSORS),
        ):
            if getattr(self, key) not in choices:
                raise self.bad(key, f"expected one of {list(choices)}")
        for key in ("Cp", "Cn", "eps"):
            if not getattr(self, key) > 0:
                raise self.bad(key, "must be > 0")
        for key in ("threshold", "neural_weight", "matcher_weight"):
            if not getattr(self, key) >= 0:
                raise self.bad(key, "must be >= 0")
        for key in ("max_iter", "max_cg_iter", "beam_size", "topk", "batch_nnz"):
            if getattr(self, key) < 1:
                raise self.bad(key, "must be an int >= 1")

    @property
    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else available_cpus()

    def added_passes(self) -> int | None:
        """The cap on the solver's passes for labels added to a trained model (None: ``max_iter``)."""
        return None


@dataclass
class HierarchicalLinearConfig(RankerConfig):
    """XR-Linear, the TF-IDF-only hierarchical model: PECOS ``XLinearModel``'s defaults.

    Same fields as :class:`RankerConfig` (the label tree comes from the indexing stage);
    ``negatives`` applies at every level below the root, ``man`` meaning the model's own
    beam at the parent level. ``features`` records what the model reads: ``tfidf`` (XR-Linear) or
    ``tfidf+neural`` (XR-Transformer's final model: TF-IDF ⊕ fine-tuned embeddings, built by the
    caller with ``concat_features`` and ``neural_weight``).
    """

    where = "xrlinear.model"

    name: str = run_field("xrlinear")
    features: str = "tfidf"
    negatives: str = "tfn"
    # weight w of the path score the levels above the labels give (the tree is XR-Linear's matcher):
    # a label scores t(label) * path^w (w * path for log- post-processors); 1 = PECOS, 0 = the label
    # rankers alone over the beam's leaf clusters. Prediction only: training's beam is unweighted.
    matcher_weight: float = predict_field(1.0)
    # how labels added to the trained model are reached at prediction: `beam` as the old labels (only
    # where the frozen beam reaches one of their leaves), `all` on every document under their leaves' path
    # scores, `alone` on every document by their own rankers, no path score (for labels trained against
    # every document, `added_negatives: all`); the old labels' beam and scores unchanged by any. `alone`:
    # chosen on EURLEX57K's held-out training documents (experiments/label_growth)
    added_reach: str = predict_field("alone")
    # what labels added to the trained model train against: `leaf` the documents of each of their leaves (the
    # mask training uses there), `all` every document given, once a label (one-vs-all; the same weights in each
    # of its leaves). Shapes only what `add_labels` trains, never the fitted model: in no cache key
    added_negatives: str = run_field("all")
    # dual CD passes at most for labels added to the trained model (and max_iter): their one-vs-all problems
    # cost about a pass over every document each. The fewest within 0.3 of retraining on EURLEX57K's held-out
    # training documents: XRLinearConfig's model sets 2, XR-Transformer's final model 5 (experiments/label_growth);
    # a folder saved before the setting keeps 100, as training. Shapes only `add_labels`
    added_max_iter: int = run_field(100)

    def check(self) -> None:
        super().check()
        if self.added_max_iter < 1:
            raise self.bad("added_max_iter", "must be an int >= 1")
        if self.added_reach not in ADDED_REACH:
            raise self.bad("added_reach", f"expected one of {list(ADDED_REACH)}")
        if self.added_negatives not in ADDED_NEGATIVES:
            raise self.bad("added_negatives", f"expected one of {list(ADDED_NEGATIVES)}")

    def added_passes(self) -> int | None:
        return self.added_max_iter

    def training_settings(self) -> dict[str, Any]:
        """Matcher-aware negatives come from the model's own beam, so its width and scores then
        shape the weights too."""
        out = super().training_settings()
        if "man" in self.negatives:
            out |= {"beam_size": self.beam_size, "post_processor": self.post_processor}
        return out
