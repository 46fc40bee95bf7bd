"""A data set as token arrays for ``train_gpu.py``: MiniLM tokens (the first ``--max-length``, as
the suite tokenises), ``--held-out`` random training documents (seed 0), the eval split, and
MiniLM's word table in fp16.

    python -m experiments.cnn_baselines.prepare --out DIR                   # EURLEX57K: 500 tokens, 5,000 held out, dev
    python -m experiments.cnn_baselines.prepare --dataset reuters21578 --max-length 128 --held-out 1000 --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def main() -> None:
    from transformers import AutoTokenizer

    from xtransformer.api import load_dataset, pretrained_encoder, resolve_model, tokenize_texts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="eurlex57k")
    ap.add_argument("--max-length", type=int, default=500)
    ap.add_argument("--held-out", type=int, default=5000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ds, base = load_dataset(args.dataset), resolve_model("minilm")
    tokenizer = AutoTokenizer.from_pretrained(base)
    perm = np.random.default_rng(0).permutation(len(ds.splits["train"].texts))
    arrays = {"held": np.sort(perm[: args.held_out]), "fit": np.sort(perm[args.held_out :])}
    for name, split in (("train", ds.splits["train"]), ("eval", ds.splits[ds.eval_split])):
        tokens = tokenize_texts(tokenizer, split.texts, args.max_length, None, progress=True)
        Y = sp.csr_matrix(split.Y)
        arrays |= {f"{name}_ids": tokens.ids.astype(np.uint16), f"{name}_offsets": tokens.offsets}
        arrays |= {f"{name}_Yindptr": Y.indptr, f"{name}_Yindices": Y.indices.astype(np.int16)}
    arrays |= {"n_labels": ds.n_labels, "pad_id": tokenizer.pad_token_id, "eval_split": ds.eval_split}
    np.savez_compressed(args.out / "tokens.npz", **arrays)
    table = pretrained_encoder(base).get_input_embeddings().weight.detach().half().numpy()
    np.save(args.out / "minilm_table.npy", table)


if __name__ == "__main__":
    main()
