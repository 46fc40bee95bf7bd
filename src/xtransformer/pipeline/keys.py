"""Every stage's cache key, computed up front from the run's typed settings and the data's content key.

A key hashes the stage's *training* record (``Settings.training_settings``) and the keys of the
stages it reads, so changing a training setting of a stage changes its key and every key
downstream, while a prediction-only or run setting changes none (``tests/test_keys.py`` checks
this for every field). The stages receive their key from here; none assembles one by hand.

The graph (→: "is read by")::

    data ─→ tfidf ─┬─→ xrlinear
                   └─→ indexing ─┬─→ matcher ─→ matcher_outputs ─→ ranker (also reads indexing, tfidf)
                                 └─→ xr_levels[0] ─→ … ─→ xr_levels[T-1] ─→ xr_outputs ─→ xrfinal (+ tfidf)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from xtransformer.pipeline.settings import RunSettings
from xtransformer.utils.io import settings_key
from xtransformer.xrtransformer.levels import EMBED_STAGE, LEVEL_STAGE


@dataclass(frozen=True)
class StageKeys:
    tfidf: str
    xrlinear: str
    indexing: str | None = None
    matcher: str | None = None
    matcher_outputs: str | None = None
    ranker: str | None = None
    xr_levels: tuple[str, ...] = ()
    xr_outputs: str | None = None
    xrfinal: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tfidf_key(source_key: str, s: RunSettings, splits: list[str]) -> str:
    return settings_key("tfidf", source_key, s.tfidf.training_settings(), sorted(splits))


def overlap_source(s: RunSettings, n_copies: int) -> list[dict[str, Any]]:
    """The model a disentangled leaf level is counted from (XR-Linear: its training settings, tree
    arity and beam); nothing at ``n_copies`` 1."""
    if n_copies == 1:
        return []
    m = s.xrlinear.model
    return [{"counts_from": "xrlinear", "model": m.training_settings(), "beam_size": m.beam_size,
             "post_processor": m.post_processor, "nr_splits": s.xrlinear.nr_splits}]


def embedding_encoder(s: RunSettings) -> dict[str, Any]:
    """The pretrained encoder that label indexing may embed texts with (neural methods only)."""
    m = s.matcher
    return {"model_name_or_path": m.model_name_or_path, "max_length": m.max_length,
            "truncate_chars": m.truncate_chars, "precision": str(s.trainer.precision)}


def matcher_predict(s: RunSettings) -> dict[str, Any]:
    """The matcher's prediction record with the precision resolved (what its outputs depend on)."""
    return s.matcher.prediction_settings() | {"inference_precision": str(s.matcher.inference_precision or
                                                                          s.trainer.precision)}


def level_keys(base_key: str, n_nodes: list[int], schedule: list[dict[str, Any]]) -> tuple[str, ...]:
    """XR-Transformer's per-level keys: level t on level t-1's key plus its own size and schedule, so
    changing level t's schedule retrains from level t on and reuses the levels before it."""
    keys, key = [], base_key
    for t, (n, sched) in enumerate(zip(n_nodes, schedule)):
        # levels after the first pool as the first resolved (before 2026-11-24 `auto` fell back to
        # [CLS] on a saved level's encoder): their old folders must not be reused
        key = settings_key(LEVEL_STAGE, key, n, sched, *([{"pooling": "as level 0"}] if t else []))
        keys.append(key)
    return tuple(keys)


def stage_keys(s: RunSettings, source_key: str, splits: list[str], xr_levels: list[int] | None = None) -> StageKeys:
    """All of a run's stage keys. ``xr_levels``: the cluster counts of the levels XR-Transformer
    fine-tunes (``stages.xr_plan``), needed for ``method=xrtransformer``."""
    tfidf = tfidf_key(source_key, s, splits)
    xrlinear = settings_key("xrlinear", tfidf, s.xrlinear.training_settings(),
                            *overlap_source(s, s.xrlinear.indexing.n_copies))
    if not s.neural:
        return StageKeys(tfidf=tfidf, xrlinear=xrlinear)
    indexing = settings_key("index", tfidf, s.indexing.training_settings(), embedding_encoder(s),
                            *overlap_source(s, s.indexing.n_copies))
    placement = s.trainer.placement()
    if s.method == "xtransformer":
        matcher = settings_key("matcher", indexing, s.matcher.training_settings(), placement)
        outputs = settings_key("matcher_outputs", matcher, matcher_predict(s))
        r = s.ranker
        uses_matcher = r.features != "tfidf" or "man" in r.negatives
        ranker = settings_key("ranker", outputs if uses_matcher else indexing, tfidf, r.training_settings())
        return StageKeys(tfidf=tfidf, xrlinear=xrlinear, indexing=indexing, matcher=matcher,
                         matcher_outputs=outputs, ranker=ranker)
    x = s.xrtransformer
    if xr_levels is None:
        raise ValueError("stage_keys: method=xrtransformer needs the fine-tuned level sizes (xr_levels)")
    base = settings_key("xrtransformer", indexing, s.matcher.training_settings(levels=False),
                        x.fine_tune_settings(), placement)
    levels = level_keys(base, xr_levels, s.matcher.level_schedule(len(xr_levels)))
    outputs = settings_key(EMBED_STAGE, levels[-1], matcher_predict(s))
    final = settings_key("xrfinal", outputs, tfidf, x.final.training_settings())
    return StageKeys(tfidf=tfidf, xrlinear=xrlinear, indexing=indexing, xr_levels=levels, xr_outputs=outputs,
                     xrfinal=final)
