"""What adding labels from texts spends on the training run's rows, beside adding from rows.

    python -m experiments.label_growth.time_run_rows --run RUN --cache CACHE [--repeats 2]

On the training texts of an XR-Transformer run (its calibration hold-out left out, as the run
trained), times finding the texts among the run's documents (digests, the stages' checksums),
taking its embeddings and TF-IDF rows, and joining them into the final model's rows: what
``add_labels(..., cache=CACHE)`` does before the rows path begins.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..common import RunFolder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run folder of experiment=eurlex57k_xr(_ensemble)")
    ap.add_argument("--cache", type=Path, required=True, help="the run's stage cache")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from xtransformer.api import EMBED_STAGE, LabeledData, RunRows, StageCache, final_features, tfidf_rows

    run = RunFolder(args.run)
    model, c = run.model("xrtransformer"), run.settings.calibration
    every = LabeledData.from_split(run.dataset, "train")
    texts = (c.hold_out(every)[0] if c.enabled else every).texts
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        rows = RunRows.find(StageCache(args.cache), model.train_settings.get("stages"), texts, ["tfidf", EMBED_STAGE])
        if rows is None:
            raise SystemExit(f"error: {args.cache} holds no stages of {args.run}'s model")
        t1 = time.perf_counter()
        emb = model.embed_rows(rows, EMBED_STAGE, texts)
        X = tfidf_rows(rows, model.tfidf, texts)
        t2 = time.perf_counter()
        final_features(model.features["kind"], X, emb, model.features["neural_weight"])
        t3 = time.perf_counter()
        print(
            f"pass {rep + 1}: {len(texts)} texts, {(rows.source < 0).sum()} not the run's; find {t1 - t0:.2f} s, "
            f"embeddings and TF-IDF rows {t2 - t1:.2f} s, final rows {t3 - t2:.2f} s, in all {t3 - t0:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
