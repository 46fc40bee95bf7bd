"""XR-Transformer on EURLEX57K at fine-tuning budgets beyond the CPU's: more steps, longer inputs.

On a GPU machine that holds the data, the plain run is the whole experiment:

    python train.py experiment=eurlex57k_xr trainer=gpu 'matcher.level_steps=[400,800,1600]' matcher.max_length=512

The tables in experiments/xr_budget/README.md were measured in three steps, so that the GPU host
needed neither the data set nor the suite's caches, only a payload of at most 64 MiB of what
fine-tuning needs (EURLEX57K texts cut to their first 400 words, which covers 512 tokens; MiniLM stored in fp16 with
the rows of tokens EURLEX never uses zeroed; the labels), fine-tuning and embedding on the GPU
(``XRTransformer.fit`` on the payload, which embeds the training split for its own final model, then
``model.embed`` of the other split; embeddings sent back as int8, row-scaled), and the final linear
model here on the TF-IDF of a CPU run's model folder:

    python -m experiments.xr_budget.bench_xr_budget payload --out .dev      # here
    python -m experiments.xr_budget.bench_xr_budget finetune --payload .dev --out $OUT x4 trainer=gpu \
        'matcher.level_steps=[400,800,1600]'                                  # on the GPU machine
    python -m experiments.xr_budget.bench_xr_budget final --run RUN --emb DIR/x4 \
        --xrlinear RUN/predictions/xrlinear/dev.npz x4                        # here

With ``--holdout N`` (payload and final alike) the payload's "train" / "dev" are the training
documents fitted on and N random ones held out (``holdout_rows``, as the held-out selections): a
fine-tuning choice then scored without the dev split. ``final --holdout N`` on embeddings of a
payload without it (an encoder fine-tuned on every training document) fits and scores the final
model on the same disjoint rows, sliced from them, for final-model choices (the row records
``encoder_saw_holdout``).

``--experiment`` (every subcommand; default eurlex57k_xr) names the experiment whose settings the
overrides amend, e.g. ``--experiment eurlex57k_xr_ensemble trainer=gpu seed=3`` fine-tunes on that
experiment's own schedule and ``final`` then uses its final model and combination share.

``finetune`` is ``XRTransformer.fit``: it builds the label tree itself, from the payload's texts
(cut to 400 words) and labels with the experiment's indexing settings (no run's tree: a model
folder keeps none, and ``fit`` takes none), and trains a final model of its own that this step
does not use. ``final`` is XR-Transformer's final model (``xrtransformer.final``, ``tree:
recluster``) as ``XRLinear.fit`` on TF-IDF ⊕ the returned embeddings, the TF-IDF from ``RUN``'s
``model/xrtransformer`` vectoriser.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..common import (
    ROOT,
    RunFolder,
    compact_encoder,
    compose_settings,
    experiment_options,
    final_model_settings,
    fit_rows,
    holdout_rows,
)

SPLITS = ("train", "dev")
WORDS = 400  # texts cut to their first 400 words: at least 512 MiniLM tokens for all but short texts


def payload(args: argparse.Namespace) -> None:
    """Everything fine-tuning needs, in few MiB: texts, labels, MiniLM in fp16."""
    from xtransformer.api import load_dataset, resolve_model

    s = compose_settings(args.overrides, args.experiment)
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ds = load_dataset(s.data)
    texts = {n: [" ".join(t.split()[:WORDS]) for t in ds.splits[n].texts] for n in SPLITS}
    Y = {n: ds.splits[n].Y.tocsr() for n in SPLITS}
    if args.holdout:  # train / dev := the training documents fitted on / held out
        rows = dict(zip(SPLITS, holdout_rows(len(texts["train"]), args.holdout, args.seed)))
        texts = {n: [texts["train"][i] for i in rows[n]] for n in SPLITS}
        Y = {n: Y["train"][rows[n]] for n in SPLITS}
    matcher = s.main.matcher
    src = Path(resolve_model(matcher.model_name_or_path, matcher.cache_dir))
    batches = (texts[n][i : i + 2000] for n in SPLITS for i in range(0, len(texts[n]), 2000))
    used, vocab = compact_encoder(src, out / "encoder", batches)
    with lzma.open(out / "texts.json.xz", "wt", preset=9) as f:
        json.dump(texts, f)
    for n in SPLITS:
        sp.save_npz(out / f"Y_{n}.npz", Y[n])
    (out / "labels.json").write_text(json.dumps(list(ds.vocab.ids)))
    print(
        f"payload in {out}: {sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) / 2**20:.1f} MiB, "
        f"{used} of {vocab} tokens used"
    )


def finetune(args: argparse.Namespace) -> None:
    """XR-Transformer's fine-tuning (``XRTransformer.fit``) and embedding pass on the payload; int8
    embeddings to --out."""
    from xtransformer.api import EMBED_STAGE, StageCache, TrainContext, XRTransformer

    p = args.payload.resolve()
    s = compose_settings([*args.overrides, f"matcher.model_name_or_path={p / 'encoder'}"], args.experiment)
    with lzma.open(p / "texts.json.xz", "rt") as fh:
        texts = json.load(fh)
    Y = {n: sp.load_npz(p / f"Y_{n}.npz").tocsr() for n in SPLITS}
    if args.max_docs:  # a smoke test of the script
        texts, Y = {n: t[: args.max_docs] for n, t in texts.items()}, {n: y[: args.max_docs] for n, y in Y.items()}
    label_ids = json.loads((p / "labels.json").read_text())
    cache = StageCache(args.work)  # a rerun of the same settings goes on from the levels it finished
    ctx = TrainContext(cache=cache, trainer=s.trainer, lightning=s.lightning)
    t0 = time.perf_counter()
    try:
        model = XRTransformer.fit(
            texts["train"],
            Y["train"],
            s.methods["xrtransformer"],
            label_ids=label_ids,
            validation=(texts["dev"], Y["dev"]),
            context=ctx,
        )
    finally:
        cache.close()
    if model is None:
        return  # a helper process of a DDP run: rank 0 embeds and writes
    fit_seconds = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # the training split was embedded by fit for its own final model: read it back, not a second pass
    fitted = cache.path(EMBED_STAGE, model.training_run.report["stage_keys"][EMBED_STAGE]) / "embeddings.npy"
    for n in SPLITS:
        if n == "train" and fitted.is_file():
            e = np.load(fitted)
        else:
            e, topb = model.embed(texts[n], model.predict_settings)
        e = np.asarray(e, np.float32)
        q = np.round(127 * e / np.maximum(np.abs(e).max(1, keepdims=True), 1e-12)).astype(np.int8)
        for i, part in enumerate(np.array_split(q, 2) if n == "train" else [q]):  # files of at most 16 MiB
            np.save(args.out / f"{args.name}.{n}{i}.npy", part)
        if n == "dev":
            sp.save_npz(args.out / f"{args.name}.topb.npz", topb)  # the label-level head on dev
    embed_seconds = time.perf_counter() - t0
    if fitted.is_file():  # fit's pass over the training split, as its stage recorded it
        embed_seconds += len(texts["train"]) / json.loads((fitted.parent / "facts.json").read_text())["docs_per_s"]
    levels = model.training_run.report["levels"]
    facts = {
        "name": args.name,
        "experiment": args.experiment,
        "overrides": args.overrides,
        # as before: fine-tuning every level and embedding both splits (fit's TF-IDF, tree and final model aside)
        "seconds": round(sum(lv["seconds"] for lv in levels) + embed_seconds, 1),
        "fit_seconds": round(fit_seconds, 1),
        "embed_seconds": round(embed_seconds, 1),
        "train_embedded_by_fit": fitted.is_file(),
        "levels": levels,
    }
    print("\n" + json.dumps(facts), flush=True)
    (args.out / f"{args.name}.facts.json").write_text(json.dumps(facts, indent=1))


def final(args: argparse.Namespace) -> None:
    """The final model on the run's TF-IDF and the returned embeddings; P@k alone and with XR-Linear."""
    from xtransformer.api import ensemble_predictions, evaluate, final_features

    s = compose_settings(args.overrides, args.experiment)
    fcfg = s.methods["xrtransformer"].xrtransformer.final
    run = RunFolder(args.run)
    ds = run.dataset
    tfidf = run.model("xrtransformer").tfidf
    X = {n: tfidf.from_texts(ds.splits[n].texts) for n in SPLITS}
    Y = {n: ds.splits[n].Y.tocsr() for n in SPLITS}
    emb = {
        n: np.vstack(
            [np.load(f).astype(np.float32) for f in sorted(args.emb.parent.glob(f"{args.emb.name}.{n}[0-9].npy"))]
        )
        for n in SPLITS
    }
    # embeddings of an encoder fine-tuned on every training document (a payload without --holdout):
    # the linear model is still fitted and scored on disjoint rows, but the encoder saw the held-out ones
    encoder_saw_holdout = bool(args.holdout) and emb["train"].shape[0] == Y["train"].shape[0]
    if args.holdout:  # as the payload's --holdout: scored on held-out training documents
        rows = dict(zip(SPLITS, holdout_rows(Y["train"].shape[0], args.holdout, args.seed)))
        X, Y = {n: X["train"][rows[n]] for n in SPLITS}, {n: Y["train"][rows[n]] for n in SPLITS}
        if encoder_saw_holdout:
            emb = {n: emb["train"][rows[n]] for n in SPLITS}
    t0 = time.perf_counter()
    F = {n: final_features(fcfg.features, X[n], emb[n], fcfg.model.neural_weight) for n in SPLITS}
    model = fit_rows(F["train"], Y["train"], ds.vocab.ids, final_model_settings(fcfg))
    P = model.predict_features_csr(F["dev"])
    seconds = time.perf_counter() - t0
    if args.predictions:
        from xtransformer.api import save_csr

        save_csr(P, args.predictions)
    row = {
        "name": args.name,
        "experiment": args.experiment,
        "overrides": args.overrides,
        "holdout": args.holdout,
        "encoder_saw_holdout": encoder_saw_holdout,
        "final_seconds": round(seconds, 1),
        "xrtransformer": evaluate(Y["dev"], P),
    }

    def fmt(m: dict) -> str:
        return " / ".join(f"{m[k]:.2f}" for k in ("P@1", "P@3", "P@5"))

    line = f"{args.name}: XR-Transformer {fmt(row['xrtransformer'])}"
    if args.xrlinear:
        # as the run's xrtransformer+xrlinear: its rule and share (combine_with_xrlinear, combine_weight)
        both = ensemble_predictions(
            [P, sp.load_npz(args.xrlinear).tocsr()],
            s.combine_with_xrlinear,
            fcfg.model.topk,
            weights=s.combine_weights(),
        )
        row["xrtransformer+xrlinear"] = evaluate(Y["dev"], both)
        line += f" | + XR-Linear {fmt(row['xrtransformer+xrlinear'])}"
    print(line)
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps(row) + "\n")


def holdout_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--holdout", type=int, default=0, help="train / dev := all but N random training documents / those N"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out rows")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("payload", help="write the GPU payload")
    a.add_argument("--out", type=Path, default=ROOT / ".dev")
    holdout_options(a)
    a = sub.add_parser("finetune", help="fine-tune and embed on the payload (on the GPU machine)")
    a.add_argument("--payload", type=Path, default=ROOT / ".dev")
    a.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "budget-out")))
    a.add_argument("--work", type=Path, default=Path("/tmp/xr-budget-cache"), help="the fine-tuning's stage cache")
    a.add_argument("--max-docs", type=int, default=None)
    a.add_argument("name")
    a = sub.add_parser("final", help="final model on the returned embeddings (here)")
    a.add_argument(
        "--run",
        type=Path,
        required=True,
        help="output folder of a CPU run of the experiment (its model/xrtransformer TF-IDF is read)",
    )
    a.add_argument("--emb", type=Path, required=True, help="DIR/NAME of NAME.{train0,train1,dev0}.npy")
    a.add_argument(
        "--xrlinear",
        type=Path,
        default=None,
        help="XR-Linear's dev predictions, e.g. RUN/predictions/xrlinear/dev.npz: also score the "
        "combination with them (not with --holdout)",
    )
    holdout_options(a)
    a.add_argument("--results", type=Path, default=None, help="append the row (json) to this file")
    a.add_argument("--predictions", type=Path, default=None, help="save the final model's dev scores here (.npz)")
    a.add_argument("name")
    for a in sub.choices.values():
        experiment_options(a)
    args = ap.parse_args(argv)
    if args.cmd == "final" and args.holdout and args.xrlinear:
        ap.error("final: --xrlinear scores the dev split; it does not go with --holdout")
    {"payload": payload, "finetune": finetune, "final": final}[args.cmd](args)


if __name__ == "__main__":
    main()
