"""The pipeline's stages: small functions from typed inputs to cached artifacts.

Every stage key hashes exactly the settings that influence the stage's output plus the key of the
stage it consumes, so changing a ranker option retrains only the ranker, and a rerun of the same
configuration reuses everything.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
from omegaconf import DictConfig, OmegaConf

from xtransformer.data import XMCDataset
from xtransformer.encoders import check_model_available, embed_texts, load_encoder
from xtransformer.indexing import (
    ClusterChain, IndexingConfig, build_index, cluster_quality, learn_overlap, overlap_summary, save_quality_plots,
)
from xtransformer.matcher import MatcherConfig, MatcherOutputs, topb_recall, train_matcher
from xtransformer.matcher.train import tiny_corpus
from xtransformer.pipeline.cache import StageCache
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig, LinearRanker, RankerConfig, concat_features
from xtransformer.ranker.negatives import binarize, negative_mask
from xtransformer.utils.io import load_json, save_json, settings_key
from xtransformer.xrtransformer import XRTransformerConfig, XRTransformerConfigError

log = logging.getLogger(__name__)

EmbedFn = Callable[[list[str]], np.ndarray]


def _plain(node: DictConfig | dict) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def matcher_config(node: DictConfig) -> MatcherConfig:
    return MatcherConfig.from_dict(_plain(node))


def check_model(mcfg: MatcherConfig) -> None:
    check_model_available(mcfg.model_name_or_path, mcfg.cache_dir)


def _features_key(ds: XMCDataset, cfg: DictConfig) -> str:
    return settings_key(ds.source_key, _plain(cfg.tfidf) | {"n_jobs": None})


# ------------------------------------------------------------------------------------ indexing
def pretrained_embedder(mcfg: MatcherConfig | None, cfg: DictConfig, ds: XMCDataset) -> EmbedFn | None:
    """Mean-pooled embeddings from the (not yet fine-tuned) encoder, for text_emb / pifa_neural."""
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
            pooling="mean", precision=mcfg.inference_precision or str(cfg.trainer.get("precision", "32")),
            truncate_chars=mcfg.truncate_chars,
        )

    return embed


def indexing_config(cfg: DictConfig) -> IndexingConfig:
    return IndexingConfig.from_mapping(_plain(cfg.indexing))


def index(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], cfg: DictConfig,
          embed_fn: EmbedFn | None) -> tuple[ClusterChain, str]:
    icfg = indexing_config(cfg)
    encoder = None
    if embed_fn is not None:  # neural representations, and the text-neighbour fallback of orphan labels
        m = _plain(cfg.matcher)
        encoder = {k: m.get(k) for k in ("model_name_or_path", "max_length", "truncate_chars")}
    key = settings_key("index", _features_key(ds, cfg), icfg.cache_settings(), encoder, *overlap_source(icfg, cfg))

    def build(tmp: Path) -> None:
        train = ds.splits["train"]
        doc_emb = embed_fn(train.texts) if "pifa_neural" in icfg.name else None
        chain, report = build_index(
            icfg, train.Y, X_train_tfidf=X["train"], doc_embeddings=doc_emb,
            label_texts=ds.label_text, embed_fn=embed_fn, label_ids=ds.vocab.ids,
        )
        if icfg.n_copies > 1:  # the matcher and the ranker then train on the overlapping leaf level
            chain, report["disentangle"] = learn_overlap(chain, X["train"], train.Y, icfg, _xrlinear_config(cfg),
                                                         int(cfg.xrlinear.nr_splits))
            report["quality"] = cluster_quality(chain, Y=train.Y, seed=icfg.seed)
        chain.save(tmp / "chain", ds.vocab.ids, report["config"])
        save_json(report, tmp / "report.json")

    folder = cache.run("indexing", key, build, settings={"indexing": dataclasses.asdict(icfg), "encoder": encoder})
    report = load_json(folder / "report.json")
    log.info("indexing %s: K=%d, levels %s, quality %s", icfg.name, report["n_clusters"], report["level_sizes"],
             report.get("quality"))
    return ClusterChain.load(folder / "chain", ds.vocab.ids), key


# ------------------------------------------------------------------------------------ matcher
def _trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    return _plain(cfg.trainer)


def matcher(cache: StageCache, ds: XMCDataset, chain: ClusterChain, mcfg: MatcherConfig, cfg: DictConfig,
            index_key: str, loggers: list[Any]) -> tuple[MatcherOutputs, str]:
    """Fine-tune the matcher, then embed + shortlist every split (``train_matcher`` resumes and caches
    inside its own folder, keyed by this stage's key plus its own training / inference keys)."""
    tcfg = _trainer_kwargs(cfg)
    key = settings_key("matcher", index_key, mcfg.training_settings(),
                       {k: str(tcfg.get(k)) for k in ("accelerator", "devices", "num_nodes", "strategy", "precision")})
    folder = cache.path("matcher", key)
    done_before = (folder / "outputs.json").is_file()
    outputs = train_matcher(
        mcfg, tcfg,
        texts={s: split.texts for s, split in ds.splits.items()},
        Y={s: split.Y for s, split in ds.splits.items()},
        C=chain.leaf_assignment,
        out_dir=folder,
        val_split="dev",
        logger=loggers or None,
    )
    cache.events.append(("matcher", key, "reused" if done_before else "ran"))
    # downstream stages depend on the inference settings too (top-b, embedding dtype, ...)
    infer = {k: v for k, v in dataclasses.asdict(mcfg).items() if k not in mcfg.training_settings()}
    return outputs, settings_key(key, {k: infer.get(k) for k in ("topb", "save_embeddings_dtype", "normalize_embeddings", "inference_precision")})


# ------------------------------------------------------------------------------------ ranker
def _ranker_config(cfg: DictConfig) -> RankerConfig:
    return RankerConfig(**_plain(cfg.ranker))


def ranker_features(rcfg: RankerConfig, X: sp.csr_matrix, emb: np.ndarray | None) -> sp.csr_matrix:
    if rcfg.features == "tfidf":
        return X
    return concat_features(X, emb, weight=rcfg.neural_weight)


def ranker(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], mout: MatcherOutputs,
           chain: ClusterChain, cfg: DictConfig, matcher_key: str) -> LinearRanker:
    rcfg = _ranker_config(cfg)
    train_settings = {k: v for k, v in dataclasses.asdict(rcfg).items() if k not in ("name", "post_processor", "matcher_weight", "beam_size", "topk", "threads")}
    uses_matcher = rcfg.features != "tfidf" or "man" in rcfg.negatives
    key = settings_key("ranker", matcher_key if uses_matcher else None, _features_key(ds, cfg), train_settings,
                       _plain(cfg.indexing) if not uses_matcher else None)

    def build(tmp: Path) -> None:
        C = chain.leaf_assignment
        emb = mout.embeddings("train") if rcfg.features != "tfidf" else None
        feats = ranker_features(rcfg, X["train"], emb)
        neg = negative_mask(rcfg.negatives, ds.splits["train"].Y, C, mout.topb("train") if "man" in rcfg.negatives else None)
        merge = IndexingConfig.from_mapping(_plain(cfg.indexing)).merge  # labels in several clusters
        LinearRanker.train(feats, ds.splits["train"].Y, C, neg, rcfg, merge=merge).save(tmp / "model")

    folder = cache.run("ranker", key, build, settings=train_settings)
    model = LinearRanker.load(folder / "model")
    model.config = rcfg  # prediction-time options (post-processor, top-k) come from this run
    return model


def predict(model: LinearRanker, X: dict[str, sp.csr_matrix], mout: MatcherOutputs, split: str) -> sp.csr_matrix:
    emb = mout.embeddings(split) if model.config.features != "tfidf" else None
    feats = ranker_features(model.config, X[split], emb)
    return model.predict(feats, mout.topb(split))


# ------------------------------------------------------------------------------------ TF-IDF-only path
def linear_train_settings(lcfg: HierarchicalLinearConfig) -> dict[str, Any]:
    """The settings that shape a hierarchical linear model's weights: all but the prediction-only
    ones, except that matcher-aware negatives come from the model's own beam (its width and scores)."""
    predict_only = {"name", "topk", "threads", "matcher_weight"}
    if "man" not in lcfg.negatives:
        predict_only |= {"beam_size", "post_processor"}
    return {k: v for k, v in dataclasses.asdict(lcfg).items() if k not in predict_only}


def xrlinear(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], cfg: DictConfig) -> HierarchicalLinear:
    """The TF-IDF-only hierarchical linear model on its own PIFA tree (PECOS XR-Linear's recipe)."""
    xcfg = _xrlinear_config(cfg)
    icfg = IndexingConfig.from_mapping(_plain(cfg.xrlinear.indexing), where="xrlinear.indexing")
    train_settings = linear_train_settings(xcfg)
    nr_splits = int(cfg.xrlinear.nr_splits)
    key = settings_key("xrlinear", _features_key(ds, cfg), train_settings, icfg.cache_settings(), nr_splits,
                       *overlap_source(icfg, cfg))

    def build(tmp: Path) -> None:
        chain, report = build_index(icfg, ds.splits["train"].Y, X_train_tfidf=X["train"], label_ids=ds.vocab.ids)
        chain = chain.subsample(nr_splits)
        if icfg.n_copies > 1:  # train on the partition, count where its search sends each label, retrain
            chain, report["disentangle"] = learn_overlap(chain, X["train"], ds.splits["train"].Y, icfg, xcfg)
        save_json(report, tmp / "index_report.json")
        HierarchicalLinear.train(X["train"], ds.splits["train"].Y, list(chain), xcfg, merge=icfg.merge).save(tmp / "model")

    folder = cache.run("xrlinear", key, build, settings=train_settings)
    model = HierarchicalLinear.load(folder / "model")
    model.config = xcfg
    return model


# ------------------------------------------------------------------------------------ XR-Transformer
def xrtransformer_config(cfg: DictConfig) -> XRTransformerConfig:
    return XRTransformerConfig.from_mapping(_plain(cfg.xrtransformer))


def xr_plan(n_labels: int, icfg: IndexingConfig, xcfg: XRTransformerConfig, mcfg: MatcherConfig) -> list[int]:
    """Cluster counts of the levels XR-Transformer will fine-tune, from the label count and the
    settings alone (the tree's shape does not depend on the data), so that a schedule that does not
    name every level, or a first level above ``max_match_clusters``, fails before any data work."""
    from xtransformer.indexing.kmeans import resolve_n_clusters, tree_levels
    from xtransformer.xrtransformer import XRTransformerConfigError
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
                  mcfg: MatcherConfig, xcfg: XRTransformerConfig, cfg: DictConfig, index_key: str,
                  loggers: list[Any]) -> tuple[HierarchicalLinear | None, Any]:
    """Fine-tune the encoder level by level, embed every split, train the final linear tree model
    on TF-IDF ⊕ embeddings. Returns ``(final model, fine-tuning result)``; ranks > 0 get no model."""
    from xtransformer.utils.dist import is_rank_zero
    from xtransformer.xrtransformer.train import fine_tune

    tcfg = _trainer_kwargs(cfg)
    tree = chain.subsample(xcfg.nr_splits)
    key = settings_key("xrtransformer", index_key, mcfg.training_settings(levels=False), xcfg.training_settings(),
                       {k: str(tcfg.get(k)) for k in ("accelerator", "devices", "num_nodes", "strategy", "precision")})
    tuned = fine_tune(mcfg, xcfg, tcfg, texts={s: split.texts for s, split in ds.splits.items()},
                      Y={s: split.Y for s, split in ds.splits.items()}, chain=list(tree), cache=cache, base_key=key,
                      eval_split=ds.eval_split, logger=loggers or None)
    if not is_rank_zero():
        return None, tuned
    fcfg = xcfg.final
    final_key = settings_key("xrfinal", tuned.key, _features_key(ds, cfg), fcfg.features, fcfg.tree, fcfg.nr_splits,
                             dataclasses.asdict(fcfg.indexing) | {"threads": None}, linear_train_settings(fcfg.model))

    def build(tmp: Path) -> None:
        from xtransformer.xrtransformer.model import final_features

        train = ds.splits["train"]
        feats = final_features(fcfg.features, X["train"], tuned.outputs.embeddings("train"), fcfg.model.neural_weight)
        final_tree = tree
        if fcfg.tree == "recluster":  # PIFA on the final features, as PECOS's refined indexer
            final_tree, report = build_index(fcfg.indexing, train.Y, X_train_tfidf=feats, label_ids=ds.vocab.ids)
            save_json(report, tmp / "index_report.json")
            final_tree = final_tree.subsample(fcfg.nr_splits)
        HierarchicalLinear.train(feats, train.Y, list(final_tree), fcfg.model).save(tmp / "model")

    folder = cache.run("xrfinal", final_key, build, settings={"final": dataclasses.asdict(fcfg)})
    model = HierarchicalLinear.load(folder / "model")
    model.config = fcfg.model  # prediction-time options (beam, top-k, post-processor) come from this run
    return model, tuned


def predict_xrtransformer(model: HierarchicalLinear, xcfg: XRTransformerConfig, X: dict[str, sp.csr_matrix],
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


def _xrlinear_config(cfg: DictConfig) -> HierarchicalLinearConfig:
    return HierarchicalLinearConfig(**_plain(cfg.xrlinear.model))


def overlap_source(icfg: IndexingConfig, cfg: DictConfig) -> list[dict[str, Any]]:
    """The model a disentangled leaf level is counted from (XR-Linear: its training settings, tree
    arity and beam), for the cache key; nothing at ``n_copies`` 1, so those keys stay as they were."""
    if icfg.n_copies == 1:
        return []
    xcfg = _xrlinear_config(cfg)
    return [{"counts_from": "xrlinear", "model": linear_train_settings(xcfg), "beam_size": xcfg.beam_size,
             "post_processor": xcfg.post_processor, "nr_splits": int(cfg.xrlinear.nr_splits)}]


def indexing_configs(cfg: DictConfig, method: str) -> dict[str, IndexingConfig]:
    """The run's index settings by Hydra path, validated (bad values fail here, before any data work)."""
    out = {"xrlinear.indexing": IndexingConfig.from_mapping(_plain(cfg.xrlinear.indexing), where="xrlinear.indexing")}
    if method != "xrlinear":
        out["indexing"] = IndexingConfig.from_mapping(_plain(cfg.indexing))
    return out


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
