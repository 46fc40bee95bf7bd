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


def index(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], cfg: DictConfig,
          embed_fn: EmbedFn | None) -> tuple[ClusterChain, str]:
    icfg = IndexingConfig.from_mapping(_plain(cfg.indexing))
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
def xrlinear(cache: StageCache, ds: XMCDataset, X: dict[str, sp.csr_matrix], cfg: DictConfig) -> HierarchicalLinear:
    """The TF-IDF-only hierarchical linear model on its own PIFA tree (PECOS XR-Linear's recipe)."""
    xcfg = _xrlinear_config(cfg)
    icfg = IndexingConfig.from_mapping(_plain(cfg.xrlinear.indexing), where="xrlinear.indexing")
    train_settings = _xrlinear_train_settings(xcfg)
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


def _xrlinear_config(cfg: DictConfig) -> HierarchicalLinearConfig:
    return HierarchicalLinearConfig(**_plain(cfg.xrlinear.model))


def _xrlinear_train_settings(xcfg: HierarchicalLinearConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(xcfg).items() if k not in ("name", "beam_size", "topk", "threads", "post_processor", "matcher_weight")}


def overlap_source(icfg: IndexingConfig, cfg: DictConfig) -> list[dict[str, Any]]:
    """The model a disentangled leaf level is counted from (XR-Linear: its training settings, tree
    arity and beam), for the cache key; nothing at ``n_copies`` 1, so those keys stay as they were."""
    if icfg.n_copies == 1:
        return []
    xcfg = _xrlinear_config(cfg)
    return [{"counts_from": "xrlinear", "model": _xrlinear_train_settings(xcfg), "beam_size": xcfg.beam_size,
             "post_processor": xcfg.post_processor, "nr_splits": int(cfg.xrlinear.nr_splits)}]


def indexing_configs(cfg: DictConfig, method: str) -> dict[str, IndexingConfig]:
    """The run's index settings by Hydra path, validated (bad values fail here, before any data work)."""
    out = {"xrlinear.indexing": IndexingConfig.from_mapping(_plain(cfg.xrlinear.indexing), where="xrlinear.indexing")}
    if method == "xtransformer":
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
