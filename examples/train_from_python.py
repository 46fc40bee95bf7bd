"""Train XR-Linear and XR-Transformer from Python on Reuters-21578, combine, save, load, predict.

    python examples/train_from_python.py                      # MiniLM on the whole data set (minutes on a CPU)
    python examples/train_from_python.py --encoder tiny:bert --max-docs 600 --steps 10 20   # seconds

No Hydra is needed: a method's settings are a typed record (``XRTransformer.settings_class``) whose
sections can be passed as keyword mappings; ``compose_settings("method=xrtransformer")`` gives the
exact settings of ``python train.py method=xrtransformer`` instead.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from xtransformer import Combination, StageCache, TrainContext, XMCModel, XRLinear, XRTransformer, load_dataset


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", default="minilm", help="matcher.model_name_or_path (minilm, tiny:bert, a folder)")
    ap.add_argument("--max-docs", type=int, default=None, help="the first N documents of each split")
    ap.add_argument("--steps", type=int, nargs=2, default=[100, 200], help="fine-tuning steps of the two levels")
    ap.add_argument("--out", type=Path, default=None, help="where the model folders go (default: a temporary folder)")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xmc-example-"))

    ds = load_dataset("reuters21578", max_docs=args.max_docs)
    train, test = ds.splits["train"], ds.splits["test"]
    labels = {"label_ids": ds.vocab.ids, "label_names": ds.label_text}  # or: lists of label ids per document

    # XR-Linear: TF-IDF -> a tree of linear one-vs-all rankers (PECOS's recipe), a minute on a CPU
    xrlinear = XRLinear.fit(train.texts, train.Y, **labels)

    # XR-Transformer: the encoder fine-tuned level by level over a 16-cluster tree, then XR-Linear on
    # TF-IDF ⊕ its embeddings. A stage cache keeps every stage: running this again reuses them.
    with TrainContext(cache=StageCache(out / "cache")) as ctx:
        xrtransformer = XRTransformer.fit(
            train.texts,
            train.Y,
            **labels,
            context=ctx,
            indexing={"n_clusters": 16},
            matcher={
                "model_name_or_path": args.encoder,
                "max_length": 64,
                "batch_size": 32,
                "lr": 1e-4,
                "head_lr": 1e-3,
                "level_steps": args.steps,
                "dropout": 0.0,
                "progress": False,
            },
            xrtransformer={"nr_splits": 16},
        )
    both = Combination([xrtransformer, xrlinear], method="average")

    scores = {}
    for model in (xrlinear, xrtransformer, both):
        scores[model.method] = model.evaluate(test.texts, test.Y).metrics["P@1"]
        print(f"{model.method:>24}: test P@1 {scores[model.method]:.2f}")

    for model in (xrlinear, xrtransformer, both):  # members first: the combination refers to their folders
        model.save(out / model.method)
    loaded = XMCModel.load(out / both.method)  # the class the folder's manifest names
    print(type(loaded).__name__, loaded.predict(["opec ministers agreed to cut crude oil output"], k=3)[0])
    return scores


if __name__ == "__main__":
    main()
