"""The pipeline's stages: small functions of typed settings and artifacts, cached under planned keys.

Each stage reads its records from :class:`~xtransformer.pipeline.settings.RunSettings` and its
cache key from :class:`~xtransformer.pipeline.keys.StageKeys` (computed up front from the
training settings and the keys of the stages it reads), so changing a ranker option retrains only
the ranker, and a rerun of the same configuration reuses everything.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from xtransformer.cache import StageCache
from xtransformer.data import XMCDataset, tfidf_features
from xtransformer.encoders import check_model_available, embed_texts, load_encoder
from xtransformer.indexing import (
    ClusterChain, IndexingConfig, build_index, cluster_quality, learn_overlap, overlap_summary, save_quality_plots,
)
from xtransformer.matcher import MatcherConfig, MatcherOutputs, topb_recall, train_matcher
from xtransformer.matcher.train import tiny_corpus
from xtransformer.pipeline.keys import StageKeys
from xtransformer.pipeline.settings import RunSettings
from xtransformer.ranker import HierarchicalLinear, LinearForest, LinearRanker, load_tree_model, ranker_features, train_ranker
from xtransformer.ranker.negatives import binarize
from xtransformer.utils.io import load_json, save_json
from xtransformer.xrtransformer import XRTransformerConfig, XRTransformerConfigError

log = logging.getLogger(__name__)

EmbedFn = Callable[[list[str]], np.ndarray]


def check_model(mcfg: MatcherConfig) -> None:
    check_model_available(mcfg.model_name_or_path, mcfg.cache_dir)


# ------------------------------------------------------------------------------------ TF-IDF
def tfidf(cache: StageCache, ds: XMCDataset, s: RunSettings, keys: StageKeys) -> tuple[dict[str, sp.csr_matrix], Path | None]:
    """TF-IDF of every split (given features pass through) and the stage folder holding the vectoriser."""
    X = tfidf_features(ds, s.tfidf, cache=cache, key=keys.tfidf)
    return X, (cache.path("tfidf", keys.tfidf) if ds.has_texts else None)


# ------------------------------------------------------------------------------------ indexing
def pretrained_embedder(s: RunSettings, ds: XMCDataset) -> EmbedFn | None:
    """Mean-pooled embeddings from the (not yet fine-tuned) encoder, for text_emb / pifa_neural."""
    mcfg = s.matcher
    if mcfg is None:
        return None
    state: dict[str, Any] = {}

    def embed(texts: list[str]) -> np.ndarray:
        if "model" not in state:  # loaded on first use: pifa_tfidf without orphan labels never needs it
            # a tiny:* model must be the one the matcher fine-tunes (tokenizer trained on train texts)
            corpus = tiny_corpus(mcfg, {"train": ds.splits["train"].texts})
            state["model"], state["tok"] = load_encoder(mcfg.model_name_or_path, mcfg.cache_dir, corpus=corpus)
            state["model"].eval()
        return embed_texts(
            state["model"], state["tok"], texts, max_length=mcfg.max_length, batch_size=mcfg.eval_batch_size,
            # the trainer's precision (a training setting, in the index key), not the matcher's inference one
            pooling="mean", precision=str(s.trainer.precision), truncate_chars=mcfg.truncate_chars,
        )

    return embed


def index(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], s: RunSettings, keys: StageKeys,
          embed_fn: EmbedFn | None) -> ClusterChain:
    icfg = s.indexing

    def build(tmp: Path) -> None:
        train = ds.splits["train"]
        doc_emb = embed_fn(train.texts) if "pifa_neural" in icfg.name else None
        chain, report = build_index(
            icfg, train.Y, X_train_tfidf=X["train"], doc_embeddings=doc_emb,
            label_texts=ds.label_text, embed_fn=embed_fn, label_ids=ds.vocab.ids,
        )
        if icfg.n_copies > 1:  # the matcher and the ranker then train on the overlapping leaf level
            chain, report["disentangle"] = learn_overlap(chain, X["train"], train.Y, icfg, s.xrlinear.model,
                                                         s.xrlinear.nr_splits)
            report["quality"] = cluster_quality(chain, Y=train.Y, seed=icfg.seed)
        chain.save(tmp / "chain", ds.vocab.ids, report["config"])
        save_json(report, tmp / "report.json")

    folder = cache.run("indexing", keys.indexing, build, settings=icfg.training_settings())
    report = load_json(folder / "report.json")
    log.info("indexing %s: K=%d, levels %s, quality %s", icfg.name, report["n_clusters"], report["level_sizes"],
             report.get("quality"))
    return ClusterChain.load(folder / "chain", ds.vocab.ids)


# ------------------------------------------------------------------------------------ matcher
def matcher(cache: StageCache, ds: XMCDataset, chain: ClusterChain, s: RunSettings, keys: StageKeys,
            loggers: list[Any]) -> MatcherOutputs:
    """Fine-tune the matcher, then embed + shortlist every split (``train_matcher`` resumes and caches
    inside its own folder, checking its model and outputs against their checksums)."""
    folder = cache.path("matcher", keys.matcher)
    done_before = cache.enabled and (folder / "outputs.json").is_file()
    outputs = train_matcher(
        s.matcher, s.trainer_kwargs,
        texts={name: split.texts for name, split in ds.splits.items()},
        Y={name: split.Y for name, split in ds.splits.items()},
        C=chain.leaf_assignment,
        out_dir=folder,
        val_split="dev",
        logger=loggers or None,
    )
    cache.events.append(("matcher", keys.matcher, "reused" if done_before else "ran"))
    return outputs


# ------------------------------------------------------------------------------------ ranker
def ranker(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], mout: MatcherOutputs,
           chain: ClusterChain, s: RunSettings, keys: StageKeys) -> LinearRanker:
    rcfg = s.ranker

    def build(tmp: Path) -> None:
        emb = mout.embeddings("train") if rcfg.features != "tfidf" else None
        top = mout.topb("train") if "man" in rcfg.negatives else None
        train_ranker(X["train"], ds.splits["train"].Y, chain.leaf_assignment, rcfg, emb, top,
                     merge=s.indexing.merge).save(tmp / "model")

    folder = cache.run("ranker", keys.ranker, build, settings=rcfg.training_settings())
    model = LinearRanker.load(folder / "model")
    model.config = rcfg  # prediction-time options (post-processor, top-k) come from this run
    return model


def predict(model: LinearRanker, X: dict[str, sp.csr_matrix], mout: MatcherOutputs, split: str) -> sp.csr_matrix:
    emb = mout.embeddings(split) if model.config.features != "tfidf" else None
    return model.predict(ranker_features(X[split], emb, model.config), mout.topb(split))


# ------------------------------------------------------------------------------------ TF-IDF-only path
def xrlinear(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], s: RunSettings,
             keys: StageKeys) -> Path:
    """The TF-IDF-only hierarchical linear model on its own PIFA tree (PECOS XR-Linear's recipe).
    Returns its stage folder (:func:`load_xrlinear` reads the model), so that a run can let go of a
    forest of GBs while the encoder trains and read it again for the model folder."""
    xcfg, icfg, nr_splits = s.xrlinear.model, s.xrlinear.indexing, s.xrlinear.nr_splits

    def build(tmp: Path) -> None:
        model, report = tree_model(icfg, nr_splits, xcfg, X["train"], ds.splits["train"].Y, ds.vocab.ids,
                                   s.xrlinear.n_trees)
        save_json(report, tmp / "index_report.json")
        model.save(tmp / "model")

    return cache.run("xrlinear", keys.xrlinear, build, settings=s.xrlinear.training_settings())


def load_xrlinear(folder: Path, s: RunSettings) -> HierarchicalLinear | LinearForest:
    """The model of an :func:`xrlinear` stage folder, with the run's prediction settings."""
    model = load_tree_model(folder / "model")
    model.config = s.xrlinear.model
    return model


def tree_model(icfg: IndexingConfig, nr_splits: int, mcfg: Any, feats: sp.csr_matrix, Y: sp.csr_matrix,
               label_ids: Any, n_trees: int = 1) -> tuple[HierarchicalLinear | LinearForest, dict[str, Any]]:
    """PIFA tree on ``feats`` (seen ``nr_splits``-way) and the hierarchical linear model over it; with
    ``icfg.n_copies > 1`` the tree's overlap is learned first (train on the partition, count where its
    search sends each label, retrain). ``n_trees > 1``: as many trees, k-means seeded ``icfg.seed + i``,
    one model each, averaged (a :class:`LinearForest`). Returns the model and the indexing report."""
    models, reports = [], []
    for i in range(n_trees):
        tcfg = dataclasses.replace(icfg, seed=icfg.seed + i) if i else icfg
        chain, report = build_index(tcfg, Y, X_train_tfidf=feats, label_ids=label_ids)
        chain = chain.subsample(nr_splits)
        if tcfg.n_copies > 1:
            chain, report["disentangle"] = learn_overlap(chain, feats, Y, tcfg, mcfg)
        models.append(HierarchicalLinear.train(feats, Y, list(chain), mcfg, merge=tcfg.merge))
        reports.append(report)
        if n_trees > 1:
            log.info("tree %d of %d trained", i + 1, n_trees)
    if n_trees == 1:
        return models[0], reports[0]
    return LinearForest(models), {**reports[0], "trees": reports}


# ------------------------------------------------------------------------------------ XR-Transformer
def xr_plan(n_labels: int, icfg: IndexingConfig, xcfg: XRTransformerConfig, mcfg: MatcherConfig) -> list[int]:
    """Cluster counts of the levels XR-Transformer will fine-tune, from the label count and the
    settings alone (the tree's shape does not depend on the data), so that a schedule that does not
    name every level, or a first level above ``max_match_clusters``, fails before any data work."""
    from xtransformer.indexing.kmeans import resolve_n_clusters, tree_levels
    from xtransformer.xrtransformer.levels import n_matched

    k = resolve_n_clusters(n_labels, icfg.n_clusters, icfg.max_leaf_size)
    sizes = [1] + [lv.n_nodes for lv in tree_levels(n_labels, k, icfg.branching)[1:]] + [n_labels]
    tree = [sizes[i] for i in ClusterChain.subsampled_levels(sizes, xcfg.nr_splits)[1:]]
    matched = tree[:n_matched(tree, xcfg.max_match_clusters)]
    if not matched:
        raise XRTransformerConfigError(
            f"xrtransformer.max_match_clusters={xcfg.max_match_clusters}: the tree's first level has {tree[0]} "
            "clusters, so no level would be fine-tuned (raise it, or lower xrtransformer.nr_splits)")
    matched = matched[-1:] if xcfg.levels == "last" else matched
    mcfg.level_schedule(len(matched))  # raises naming matcher.level_* when the lists do not fit
    return matched


def xrtransformer(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], chain: ClusterChain,
                  s: RunSettings, keys: StageKeys, loggers: list[Any]) -> tuple[HierarchicalLinear | LinearForest | None, Any]:
    """Fine-tune the encoder level by level, embed every split, train the final linear tree model
    on TF-IDF ⊕ embeddings. Returns ``(final model, fine-tuning result)``; ranks > 0 get no model."""
    from xtransformer.utils.dist import is_rank_zero
    from xtransformer.xrtransformer.train import fine_tune

    xcfg = s.xrtransformer
    tree = chain.subsample(xcfg.nr_splits)
    tuned = fine_tune(s.matcher, xcfg, s.trainer_kwargs, texts={n: split.texts for n, split in ds.splits.items()},
                      Y={n: split.Y for n, split in ds.splits.items()}, chain=list(tree), cache=cache,
                      level_keys=keys.xr_levels, embed_key=keys.xr_outputs, eval_split=ds.eval_split,
                      logger=loggers or None)
    if not is_rank_zero():
        return None, tuned
    fcfg = xcfg.final

    def build(tmp: Path) -> None:
        from xtransformer.xrtransformer.model import final_features

        train = ds.splits["train"]
        feats = final_features(fcfg.features, X["train"], tuned.outputs.embeddings("train"), fcfg.model.neural_weight)
        model, report = train_final(fcfg, feats, train.Y, ds.vocab.ids, tree, s.indexing.merge)
        if report is not None:
            save_json(report, tmp / "index_report.json")
        model.save(tmp / "model")

    folder = cache.run("xrfinal", keys.xrfinal, build, settings=fcfg.training_settings())
    model = load_tree_model(folder / "model")
    model.config = fcfg.model  # prediction-time options (beam, top-k, post-processor) come from this run
    return model, tuned


def train_final(fcfg: Any, feats: sp.csr_matrix, Y: sp.csr_matrix, label_ids: Any, tree: ClusterChain,
                merge: str) -> tuple[HierarchicalLinear | LinearForest, dict[str, Any] | None]:
    """XR-Transformer's final linear model on its final features (``fcfg``: ``xrtransformer.final``),
    over the fine-tuning ``tree`` or a tree re-clustered on the features; the re-clustering's report."""
    if fcfg.tree == "recluster":  # PIFA on the final features, as PECOS's refined indexer
        return tree_model(fcfg.indexing, fcfg.nr_splits, fcfg.model, feats, Y, label_ids, fcfg.n_trees)
    # "same" keeps the fine-tuning tree, its copies included
    return HierarchicalLinear.train(feats, Y, list(tree), fcfg.model, merge=merge), None


def predict_xrtransformer(model: HierarchicalLinear | LinearForest, xcfg: XRTransformerConfig, X: dict[str, sp.csr_matrix],
                          tuned: Any, split: str) -> sp.csr_matrix:
    from xtransformer.xrtransformer.model import combine_with_head, final_features

    feats = final_features(xcfg.final.features, X[split], tuned.outputs.embeddings(split), model.config.neural_weight)
    pred = model.predict(feats)
    if xcfg.final.combine_head is None:
        return pred
    try:
        return combine_with_head(pred, tuned.outputs.topb(split), model.config.post_processor,
                                 xcfg.final.combine_head, model.config.topk)
    except ValueError as err:
        raise XRTransformerConfigError(f"xrtransformer.{err}") from None


def index_section(n_copies: int, C: sp.spmatrix) -> dict[str, Any]:
    """``metrics.json``'s ``index``: λ and how much the leaf level the model used overlaps."""
    return {"n_copies": n_copies, **overlap_summary(C)}


# ------------------------------------------------------------------------------------ reports
def cluster_recall(Y: sp.csr_matrix, chain: ClusterChain, topb: sp.csr_matrix) -> dict[str, float]:
    """Share of a document's true clusters inside the matcher's top-b (in percent)."""
    b = int(np.diff(topb.indptr).max(initial=0))
    return {f"cluster_recall@{b}": round(100 * topb_recall(topb, binarize(Y @ chain.leaf_assignment)), 3)}


def plots(out_dir: Path, ds: XMCDataset, chain: ClusterChain) -> list[Path]:
    return save_quality_plots(out_dir, ds.splits["train"].Y, chain, title=ds.name)
