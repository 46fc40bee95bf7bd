"""A dataset the suite reads (default Reuters-21578's raw-text split) written in PECOS's xmc-base
layout, the layout of ``data=eurlex-4k`` and the other seed-paper sets: ``X.trn.txt`` /
``X.tst.txt``, ``Y.trn.npz`` / ``Y.tst.npz`` (label columns in the dataset's label order),
``output-items.txt`` (the label names) and ``tfidf-attnxml/X.{trn,tst}.npz``: the suite's TF-IDF
(``TfidfConfig()``'s defaults) fit on all training documents, the test documents transformed with
it, standing in for the TF-IDF rows PECOS's archives ship.

    python -m experiments.xmc_base.convert --out /tmp/reuters-xmc-base
    python train.py data=eurlex-4k data.path=/tmp/reuters-xmc-base method=xrlinear [tfidf=given]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import (
        DataConfig,
        TfidfConfig,
        TfidfFeatures,
        read_folder,
        resolve_dataset_dir,
        write_xmc_base,
    )

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="reuters21578", help="a dataset name (data=...) with train and test splits")
    ap.add_argument("--out", type=Path, required=True, help="the folder to write")
    args = ap.parse_args(argv)
    cfg = DataConfig(name=args.data)
    got = read_folder(resolve_dataset_dir(cfg), cfg)  # the files' own splits: no dev carved out of train
    train, test = got.splits["train"], got.splits["test"]
    features, X_train = TfidfFeatures.fit(train.texts, TfidfConfig())
    write_xmc_base(
        args.out,
        texts={"train": train.texts, "test": test.texts},
        Y={"train": train.Y, "test": test.Y},
        label_names=got.label_text,
        tfidf={"train": X_train, "test": features.from_texts(test.texts)},
    )
    print(f"{args.data}: {len(train)} train / {len(test)} test documents, {len(got.vocab)} labels, "
          f"{X_train.shape[1]} TF-IDF features -> {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
