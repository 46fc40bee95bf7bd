"""The XR-Transformer model class: fit, predict, save, load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.inputs import LabeledData
from xtransformer.data.tfidf import TfidfFeatures, tfidf_key
from xtransformer.indexing import ClusterChain, IndexingConfig, check_copies_fit
from xtransformer.matcher.config import MatcherConfig
from xtransformer.matcher.inference import LoadedMatcher
from xtransformer.methods.base import ModelRecords, with_settings
from xtransformer.methods.neural import (
    RANKER_DIR,
    TREE_DIR,
    NeuralModel,
    embedding_record,
    encoder_predict_settings,
    index_key,
    outputs_key,
)
from xtransformer.methods.xrlinear import fit_tree_model, index_section
from xtransformer.methods.xrlinear.model import ranker_predict_settings
from xtransformer.methods.xrtransformer.config import (
    FinalModelConfig,
    XRTransformerConfig,
    XRTransformerConfigError,
    XRTransformerSettings,
)
from xtransformer.methods.xrtransformer.features import combine_with_head, final_features
from xtransformer.methods.xrtransformer.levels import EMBED_STAGE, LEVEL_STAGE, n_matched
from xtransformer.model.folder import ModelError
from xtransformer.ranker import HierarchicalLinear, LinearForest, load_tree_model
from xtransformer.utils.io import save_json, settings_key
from xtransformer.utils.rows import unit_rows


class XRTransformer(NeuralModel):
    """TF-IDF + the fine-tuned encoder's embeddings -> the final linear tree model (beam search),
    optionally combined with the label-level head (``combine_head``)."""

    kind = "xrtransformer"
    # one leaf by routes, each new label trained against every document and scored alone (its final
    # model's `added_negatives: all`, `added_reach: alone`): the fewest leaves within 0.3 of retraining
    # on held-out training documents (experiments/label_growth)
    default_placement = "routes"
    default_leaves = 1
    settings_class = XRTransformerSettings

    def __init__(
        self,
        records: ModelRecords,
        tfidf: TfidfFeatures,
        matcher: LoadedMatcher,
        features: dict[str, Any],
        final: HierarchicalLinear | LinearForest | None = None,
        chain: ClusterChain | None = None,
    ):
        super().__init__(records, tfidf, matcher, features)
        self.final = final
        self.chain = chain  # the indexing tree it fine-tuned over (None in folders written before it was kept)

    # ------------------------------------------------------------------ training
    @classmethod
    def stage_keys(cls, s: XRTransformerSettings, data_key: str, n_labels: int, trainer: Any) -> dict[str, Any]:
        """Every stage's cache key, from the settings, the training data's content key, the label
        count (the level plan) and the trainer's placement and precision. Level ``t``'s key builds
        on level ``t - 1``'s plus its own size and schedule: changing a level's schedule retrains
        from that level on."""
        x, m = s.xrtransformer, s.matcher
        sizes = level_plan(n_labels, s.indexing, x, m)
        tfidf = tfidf_key(data_key, s.tfidf)
        indexing = index_key(s, tfidf, trainer.precision)
        key = settings_key(
            "xrtransformer", indexing, m.key_settings(levels=False), x.fine_tune_settings(), trainer.placement()
        )
        levels = []
        for t, (n, sched) in enumerate(zip(sizes, m.level_schedule(len(sizes)))):
            # levels after the first pool as the first resolved: folders of older rules are not reused
            key = settings_key(LEVEL_STAGE, key, n, sched, *([{"pooling": "as level 0"}] if t else []))
            levels.append(key)
        outputs = outputs_key(EMBED_STAGE, levels[-1], m, trainer.precision)
        final = settings_key("xrfinal", outputs, tfidf, x.final.training_settings())
        return {
            "tfidf": tfidf,
            "indexing": indexing,
            LEVEL_STAGE: tuple(levels),
            EMBED_STAGE: outputs,
            "xrfinal": final,
        }

    @classmethod
    def _check(cls, data: LabeledData, s: XRTransformerSettings) -> None:
        super()._check(data, s)
        if s.xrtransformer.final.tree == "recluster":
            check_copies_fit(s.xrtransformer.final.indexing, data.n_labels, "xrtransformer.final.indexing")

    @classmethod
    def _fit(
        cls, data: LabeledData, s: XRTransformerSettings, ctx: Any, validation: LabeledData | None, keys: dict[str, Any]
    ) -> XRTransformer | None:
        from xtransformer.methods.xrtransformer.finetune import fine_tune

        t = cls._tree_inputs(ctx, data, s, keys)
        mcfg, tfidf, X, chain = t.mcfg, t.tfidf, t.X, t.chain
        tree = chain.subsample(s.xrtransformer.nr_splits)
        tuned = fine_tune(ctx, data, list(tree), mcfg, s.xrtransformer, keys[LEVEL_STAGE], validation)
        if not ctx.is_rank_zero:
            return None  # a DDP helper process: its share of the fine-tuning is done
        fcfg = s.xrtransformer.final
        features = embedding_record(fcfg.features, fcfg.model.neural_weight, mcfg)
        predict = (
            encoder_predict_settings(mcfg, ctx.trainer.precision)
            | {"combine_head": fcfg.combine_head}
            | ranker_predict_settings(fcfg.model)
        )
        records = ModelRecords.of(
            data,
            predict,
            s.training_settings()
            | {"matcher": mcfg.training_settings(levels=True), "trainer": ctx.trainer.placement()},
        )
        model = cls(records, tfidf, LoadedMatcher.load(tuned.model_dir, ctx.trainer.device), features, chain=chain)
        model.to(ctx.trainer.device)
        emb, _ = model.embed_stage(ctx, EMBED_STAGE, keys[EMBED_STAGE], data, mcfg.progress)
        model.final = final_stage(
            ctx, keys["xrfinal"], data, final_features(fcfg.features, X, emb, fcfg.model.neural_weight), s, tree
        )
        model.training_run.report |= {
            "stage_keys": keys,
            "levels": tuned.levels,
            "index": index_section(s.indexing.n_copies, chain.leaf_assignment),
        }
        return model

    def with_final_model(
        self, final: HierarchicalLinear | LinearForest, label_ids: list[str], label_names: list[str]
    ) -> XRTransformer:
        """This model's TF-IDF, encoder and settings around another final model over the labels
        ``label_ids`` / ``label_names`` (e.g. one refitted on this model's rows without some labels),
        encoding where this one does. It keeps no fine-tuning tree: this one's holds its own labels."""
        if len(label_ids) != final.n_labels or len(label_names) != len(label_ids):
            raise ModelError(
                f"{len(label_ids)} label ids and {len(label_names)} names for a final model of {final.n_labels} labels"
            )
        records = ModelRecords(
            list(label_ids), list(label_names), dict(self.predict_settings), dict(self.train_settings)
        )
        out = XRTransformer(records, self.tfidf, self.matcher, self.features, final)
        out.device = self.device
        return out

    # ------------------------------------------------------------------ prediction
    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        X = self.tfidf.from_texts(texts)
        emb, head = self.embed(texts, settings)
        if report is not None:
            report["zero_shot_rows"] = unit_rows(emb.astype(np.float32))
        model = with_settings(self.final, settings)
        scores = model.predict(final_features(self.features["kind"], X, emb, self.features["neural_weight"]))
        if not settings.get("combine_head"):
            return scores
        head = added_columns(head, self.n_labels, self.train_settings)
        try:
            return combine_with_head(
                scores, head, model.config.post_processor, settings["combine_head"], model.config.topk
            )
        except ValueError as err:
            raise XRTransformerConfigError(f"xrtransformer.{err}") from None

    # ------------------------------------------------------------------ growing
    def _add_labels(self, plan: Any) -> tuple[XRTransformer, dict[str, Any]]:
        """New labels in the final tree as ``plan.placing`` says (by default the leaves the final
        model's beam reaches most often from their documents, read as TF-IDF ⊕ the fine-tuned
        embeddings), and in the fine-tuning tree at its λ nearest leaves (it has no beam of its own)."""
        from xtransformer.indexing.placement import grow_chain, leaves_per_label, place_labels
        from xtransformer.methods.adding import grown_reach, grown_report
        from xtransformer.methods.reuse import tfidf_rows

        texts = plan.data.require_texts("adding labels to an xrtransformer model")
        rows = plan.run_rows(self.train_settings.get("stages"), ["tfidf", EMBED_STAGE])
        emb = self.embed_rows(rows, EMBED_STAGE, texts, progress=True)
        X = tfidf_rows(rows, self.tfidf, texts)
        feats = final_features(self.features["kind"], X, emb, self.features["neural_weight"])
        final, report = self.final.add_labels(feats, plan.data.Y, placing=plan.placing)
        final.config = self.final.config
        chain = self.chain
        if chain is not None:
            placed = place_labels(plan.data.Y, feats, chain.leaf_assignment, leaves_per_label(chain.leaf_assignment))
            chain = grow_chain(chain, placed.leaves)
        out = XRTransformer(self.grown_records(plan), self.tfidf, self.matcher, self.features, final, chain)
        out.predict_settings["added_reach"] = grown_reach(
            out.predict_settings, final.config.added_reach, report["negatives"]
        )
        out.device = self.device
        return out, grown_report(report, plan.new_ids)

    # ------------------------------------------------------------------ folders
    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        components = self._save_neural(tmp)  # the encoder, and the head for combine_head
        self.final.save(tmp / RANKER_DIR)
        if self.chain is not None:  # the tree it fine-tuned over (final.tree: same ranks on it too)
            self.chain.save(tmp / TREE_DIR, self.label_ids)
            components["label_tree"] = TREE_DIR
        return components

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> XRTransformer:
        tfidf, matcher = cls._load_neural(folder)
        chain = ClusterChain.load(folder / components["label_tree"]) if "label_tree" in components else None
        return cls(records, tfidf, matcher, components["features"], load_tree_model(folder / RANKER_DIR), chain)


def added_columns(head: sp.csr_matrix, n_labels: int, train: dict[str, Any]) -> sp.csr_matrix:
    """The label-level head's scores widened to the labels added since training (they score 0 there)."""
    added = sum(len(a["ids"]) for a in train.get("added_labels", []))
    if not added or head.shape[1] != n_labels - added:
        return head
    return sp.csr_matrix((head.data, head.indices, head.indptr), shape=(head.shape[0], n_labels))


def final_stage(
    ctx: Any, key: str, data: LabeledData, feats: sp.csr_matrix, s: XRTransformerSettings, tree: ClusterChain
) -> HierarchicalLinear | LinearForest:
    """The final linear model on TF-IDF ⊕ the fine-tuned embeddings (stage ``xrfinal``), over the
    fine-tuning tree (``final.tree: same``, its copies included) or a tree re-clustered on the
    features (``recluster``, PECOS's refined indexer)."""
    fcfg = s.xrtransformer.final

    def build(tmp: Path) -> None:
        if fcfg.tree == "recluster":
            x = fcfg.as_xrlinear()
            model, report = fit_tree_model(x.indexing, x.nr_splits, x.model, feats, data.Y, data.label_ids, x.n_trees)
            save_json(report, tmp / "index_report.json")
        else:
            model = HierarchicalLinear.train(feats, data.Y, list(tree), fcfg.model, merge=s.indexing.merge)
        model.save(tmp / "model")

    folder = ctx.cache.run("xrfinal", key, build, settings=fcfg.training_settings())
    model = load_tree_model(folder / "model")
    model.config = fcfg.model  # prediction-time options (beam, top-k, post-processor) come from these settings
    return model


def level_plan(n_labels: int, icfg: IndexingConfig, xcfg: XRTransformerConfig, mcfg: MatcherConfig) -> list[int]:
    """Cluster counts of the levels XR-Transformer will fine-tune, from the label count and the
    settings alone (the tree's shape does not depend on the data), so that a schedule that does not
    name every level, or a first level above ``max_match_clusters``, fails before any data work."""
    from xtransformer.indexing.kmeans import resolve_n_clusters, tree_levels

    k = resolve_n_clusters(n_labels, icfg.n_clusters, icfg.max_leaf_size)
    sizes = [1] + [lv.n_nodes for lv in tree_levels(n_labels, k, icfg.branching)[1:]] + [n_labels]
    tree = [sizes[i] for i in ClusterChain.subsampled_levels(sizes, xcfg.nr_splits)[1:]]
    matched = tree[: n_matched(tree, xcfg.max_match_clusters)]
    if not matched:
        raise XRTransformerConfigError(
            f"xrtransformer.max_match_clusters={xcfg.max_match_clusters}: the tree's first level has {tree[0]} "
            "clusters, so no level would be fine-tuned (raise it, or lower xrtransformer.nr_splits)"
        )
    matched = matched[-1:] if xcfg.levels == "last" else matched
    mcfg.level_schedule(len(matched))  # raises naming matcher.level_* when the lists do not fit
    return matched


__all__ = ["FinalModelConfig", "XRTransformer", "XRTransformerSettings", "level_plan"]
