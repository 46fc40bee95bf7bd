"""The X-Transformer model class: fit, predict, save, load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.inputs import LabeledData
from xtransformer.data.tfidf import TfidfFeatures, tfidf_key
from xtransformer.encoders import check_model_available
from xtransformer.indexing import ClusterChain
from xtransformer.matcher.train import fine_tune_matcher, topb_recall
from xtransformer.methods.base import ModelRecords, with_settings
from xtransformer.methods.cnn.matcher import train_cnn_matcher
from xtransformer.methods.neural import (
    RANKER_DIR,
    TREE_DIR,
    Matcher,
    NeuralModel,
    embedding_record,
    encoder_predict_settings,
    index_key,
    load_matcher,
    outputs_key,
)
from xtransformer.methods.xrlinear import index_section
from xtransformer.methods.xtransformer.config import XTransformerSettings
from xtransformer.model.folder import ModelError
from xtransformer.ranker import LinearRanker, RankerConfig, concat_features, train_ranker
from xtransformer.ranker.negatives import binarize
from xtransformer.utils.io import settings_key
from xtransformer.utils.rows import unit_rows


class XTransformer(NeuralModel):
    """TF-IDF + a trained matcher (top-b clusters, embeddings; a fine-tuned transformer or a text
    CNN) -> a LinearRanker over the shortlist."""

    kind = "xtransformer"
    settings_class = XTransformerSettings

    def __init__(
        self,
        records: ModelRecords,
        tfidf: TfidfFeatures,
        matcher: Matcher,
        features: dict[str, Any],
        chain: ClusterChain,
        ranker: LinearRanker | None = None,
    ):
        super().__init__(records, tfidf, matcher, features)
        self.chain = chain
        self.ranker = ranker

    # ------------------------------------------------------------------ training
    @classmethod
    def _check(cls, data: LabeledData, s: XTransformerSettings) -> None:
        super()._check(data, s)
        if s.cnn_matcher:
            check_model_available(s.cnn.encoder, s.cnn.cache_dir)

    @classmethod
    def stage_keys(cls, s: XTransformerSettings, data_key: str, n_labels: int, trainer: Any) -> dict[str, str]:
        tfidf = tfidf_key(data_key, s.tfidf)
        indexing = index_key(s, tfidf, trainer.precision)
        matcher = settings_key("matcher", indexing, *s.matcher_recipe(), trainer.placement())
        outputs = outputs_key("matcher_outputs", matcher, s.matcher, trainer.precision)
        ranker = settings_key(
            "ranker", outputs if reads_matcher(s.ranker) else indexing, tfidf, s.ranker.training_settings()
        )
        return {"tfidf": tfidf, "indexing": indexing, "matcher": matcher, "matcher_outputs": outputs, "ranker": ranker}

    @classmethod
    def _fit(
        cls, data: LabeledData, s: XTransformerSettings, ctx: Any, validation: LabeledData | None, keys: dict[str, str]
    ) -> XTransformer | None:
        t = cls._tree_inputs(ctx, data, s, keys)
        mcfg, tfidf, X, chain = t.mcfg, t.tfidf, t.X, t.chain
        if s.cnn_matcher:
            folder = train_cnn_matcher(ctx, keys["matcher"], data, chain.leaf_assignment, s.cnn, validation)
        else:
            folder = fine_tune_matcher(ctx, keys["matcher"], data, chain.leaf_assignment, mcfg, validation)
        if not ctx.is_rank_zero:
            return None  # a DDP helper process: its share of the fine-tuning is done
        length = mcfg.embed_max_length or (s.cnn.embed_length if s.cnn_matcher else None)
        features = embedding_record(s.ranker.features, s.ranker.neural_weight, mcfg, length)
        predict = encoder_predict_settings(mcfg, ctx.trainer.precision) | ranker_predict_settings(s.ranker)
        records = ModelRecords.of(data, predict, s.training_settings() | {"trainer": ctx.trainer.placement()})
        model = cls(records, tfidf, load_matcher(folder, ctx.trainer.device), features, chain).to(ctx.trainer.device)
        model.ranker = model._ranker_stage(ctx, keys, data, X, s)
        model.training_run.report |= {
            "stage_keys": keys,
            "index": index_section(s.indexing.n_copies, chain.leaf_assignment),
        }
        return model

    def _ranker_stage(
        self, ctx: Any, keys: dict[str, str], data: LabeledData, X: sp.csr_matrix, s: XTransformerSettings
    ) -> LinearRanker:
        rcfg = s.ranker
        reads = reads_matcher(rcfg)
        emb, topb = (
            self.embed_stage(ctx, "matcher_outputs", keys["matcher_outputs"], data, s.matcher.progress)
            if reads
            else (None, None)
        )

        def build(tmp: Path) -> None:
            train_ranker(
                X,
                data.Y,
                self.chain.leaf_assignment,
                rcfg,
                emb if rcfg.features != "tfidf" else None,
                topb if "man" in rcfg.negatives else None,
                merge=s.indexing.merge,
            ).save(tmp / "model")

        folder = ctx.cache.run("ranker", keys["ranker"], build, settings=rcfg.training_settings())
        ranker = LinearRanker.load(folder / "model")
        ranker.config = rcfg  # prediction-time options (post-processor, top-k) come from these settings
        return ranker

    # ------------------------------------------------------------------ prediction
    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        X = self.tfidf.from_texts(texts)
        emb, topb = self.embed(texts, settings)
        if report is not None:
            report["topb"], report["zero_shot_rows"] = topb, unit_rows(emb.astype(np.float32))
        feats = (
            X if self.features["kind"] == "tfidf" else concat_features(X, emb, weight=self.features["neural_weight"])
        )
        return with_settings(self.ranker, settings).predict(feats, topb)

    def _diagnose(self, data: LabeledData, report: dict[str, Any]) -> dict[str, Any]:
        """The matcher's cluster recall: the share of a document's true clusters in its top-b."""
        if "topb" not in report:
            return {}
        topb, Y = report["topb"], data.Y[np.flatnonzero(report["kept"])]
        b = int(np.diff(topb.indptr).max(initial=0))
        recall = topb_recall(topb, binarize(Y @ self.chain.leaf_assignment))
        return {"matcher_cluster_recall": {f"cluster_recall@{b}": round(100 * recall, 3)}}

    # ------------------------------------------------------------------ growing
    def _add_labels(self, plan: Any) -> tuple[XTransformer, dict[str, Any]]:
        """New labels at the leaves nearest them in the tree's representation (PIFA-TF-IDF, else PIFA
        over the ranker's features), or those the matcher's top-b clusters reach from their documents
        (``plan.placing``), ranked over the matcher's top-b clusters as trained."""
        from xtransformer.indexing.placement import grow_chain, place_labels
        from xtransformer.methods.adding import grown_report
        from xtransformer.methods.reuse import tfidf_rows

        if plan.placing.negatives == "all":  # its ranker scores a label only over the matcher's clusters
            raise ModelError("negatives 'all' is for the tree models (xrlinear, xrtransformer): an xtransformer "
                             "model trains added labels on its matcher's clusters")  # fmt: skip
        texts = plan.data.require_texts("adding labels to an xtransformer model")
        X = tfidf_rows(plan.run_rows(self.train_settings.get("stages"), ["tfidf"]), self.tfidf, texts)
        emb, topb = self.embed(texts, self.predict_settings, progress=True)
        feats = (
            X if self.features["kind"] == "tfidf" else concat_features(X, emb, weight=self.features["neural_weight"])
        )
        index_name = self.train_settings.get("indexing", {}).get("name", "pifa_tfidf")
        C = self.chain.leaf_assignment
        X_index = X if index_name == "pifa_tfidf" else feats
        placed = place_labels(plan.data.Y, X_index, C, plan.placing.n_leaves(C), topb, by=plan.placing.by)
        ranker, report = self.ranker.add_labels(feats, plan.data.Y, placed.leaves, topb)
        ranker.config = self.ranker.config
        out = XTransformer(
            self.grown_records(plan), self.tfidf, self.matcher, self.features, grow_chain(self.chain, placed.leaves)
        )
        out.ranker, out.device = ranker, self.device
        return out, grown_report(report | {"placement": placed.summary(), "leaves": placed.leaves}, plan.new_ids)

    # ------------------------------------------------------------------ folders
    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        components = self._save_neural(tmp)
        self.ranker.save(tmp / RANKER_DIR)
        self.chain.save(tmp / TREE_DIR, self.label_ids)
        return components | {"label_tree": TREE_DIR}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> XTransformer:
        tfidf, matcher = cls._load_neural(folder)
        return cls(
            records,
            tfidf,
            matcher,
            components["features"],
            ClusterChain.load(folder / TREE_DIR),
            LinearRanker.load(folder / RANKER_DIR),
        )


def reads_matcher(rcfg: RankerConfig) -> bool:
    """Whether the ranker trains on the matcher's outputs (neural features or matcher-aware negatives)."""
    return rcfg.features != "tfidf" or "man" in rcfg.negatives


def ranker_predict_settings(rcfg: RankerConfig) -> dict[str, Any]:
    """The ranker's prediction record and thread count; one level, so no beam."""
    return {k: v for k, v in (rcfg.prediction_settings() | {"threads": rcfg.threads}).items() if k != "beam_size"}
