"""Matcher benchmarks on this machine (CPU): loop overhead, fp32 vs bf16 speed, Reuters recall.

    python -m benchmarks.bench_matcher loop                      # Lightning vs bare PyTorch loop, MiniLM
    python -m benchmarks.bench_matcher loop --model tiny:bert --batch-size 4 --max-length 16 --steps 100 \
        --warmup 5 --repeats 4                                   # ~20 ms steps: Lightning's fixed cost per step
    python -m benchmarks.bench_matcher speed                     # train steps/s + docs/s, fp32 vs bf16
    python -m benchmarks.bench_matcher reuters --steps 300       # cluster recall@b: untrained vs trained

``loop`` trains the same module (same seed, same initial weights) on the same batches (the
matcher's own DataModule, same order) with the same AdamW groups, warmup/decay schedule, gradient
clipping and precision, once through ``lightning.Trainer`` (with its CSV logger and the module's
``self.log`` calls, as ``fine_tune_matcher`` runs it; no checkpoints) and once through a plain
``for batch in loader`` loop; steps/s counts the steps after ``--warmup``. Repeats alternate the
order of the two because the machine is shared: read the per-repeat ratio more than the absolute
numbers. Lightning's cost is a fixed few milliseconds per step, so the ratio depends on the step
time: measure that cost on tiny steps, and the ratio on the real model.

``speed`` times ``--steps`` training steps and the encoding of ``--docs`` Reuters test documents in
each precision, interleaved. ``reuters`` builds clusters (PIFA-TF-IDF + our hierarchical balanced
k-means, K = ``--clusters``), scores the test split with the untrained encoder + random head, then
runs ``fine_tune_matcher`` and scores again (recall@b for several b from one top-``max b`` shortlist).

Results print as JSON and go to ``benchmarks/work/matcher/<mode>-<model>-<precision>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

for _k, _v in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}.items():
    os.environ.setdefault(_k, _v)

import numpy as np
import scipy.sparse as sp
import torch

BENCH_DIR = Path(__file__).resolve().parent
WORK = BENCH_DIR / "work" / "matcher"


# --------------------------------------------------------------------------- data


def reuters_problem(
    n_clusters: int, seed: int = 0
) -> tuple[dict[str, list[str]], dict[str, sp.csr_matrix], sp.csr_matrix]:
    """Reuters-21578 texts / labels and a PIFA-TF-IDF balanced k-means label clustering (L x K)."""
    from xtransformer.api import hierarchical_kmeans, label_representation, load_dataset, tfidf_features

    ds = load_dataset("reuters21578")
    X = tfidf_features(ds)
    texts = {s: list(split.texts) for s, split in ds.splits.items()}
    Y = {s: split.Y for s, split in ds.splits.items()}
    feats, _ = label_representation("pifa_tfidf", Y["train"], X_tfidf=X["train"])
    C = hierarchical_kmeans(feats, n_clusters=n_clusters, seed=seed).leaf_assignment
    return texts, Y, sp.csr_matrix(C)


def matcher_config(args: argparse.Namespace, **overrides: Any) -> Any:
    from xtransformer.api import MatcherConfig

    values = {
        "model_name_or_path": args.model,
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "head_lr": args.head_lr,
        "max_steps": args.steps,
        "warmup_ratio": 0.1,
        "topb": max(args.b),
        "progress": False,
        "seed": args.seed,
    }
    values.update(overrides)
    return MatcherConfig(**values)


def build(args: argparse.Namespace, cfg: Any, texts: dict, Y: dict, C: sp.csr_matrix) -> tuple[Any, Any]:
    """(MatcherModule, set-up MatcherDataModule) with the initial weights fixed by the seed."""
    import lightning.pytorch as pl

    from xtransformer.api import MatcherDataModule, MatcherModule, TrainOptions, resolve_model

    corpus = texts["train"] if args.model.startswith("tiny:") else None
    base = resolve_model(args.model, corpus=corpus)
    dm = MatcherDataModule(base, texts, Y, C, cfg, val_split=None)
    dm.prepare_data()
    dm.setup("fit")
    pl.seed_everything(cfg.seed, verbose=False)
    module = MatcherModule(
        str(base), C.shape[1], TrainOptions.of(cfg), with_token_types=dm.tokens["train"].type_ids is not None
    )
    return module, dm


# --------------------------------------------------------------------------- loops


def steps_per_second(stamps: list[float], warmup: int) -> float:
    """Steps/s over the steps after ``warmup`` (``stamps[i]``: end time of step i)."""
    kept = stamps[warmup:]
    return (len(kept) - 1) / (kept[-1] - kept[0])


def bare_loop(module: Any, loader: Any, steps: int, precision: str, grad_clip: float | None) -> list[float]:
    """The same optimisation as Lightning's automatic loop, written out by hand."""
    from xtransformer.api import LinearWarmupDecay, autocast_context, squared_hinge_loss

    module.train()
    optimizer = torch.optim.AdamW(module.param_groups(), lr=module.hparams.lr, eps=module.hparams.adam_eps)
    schedule = LinearWarmupDecay(round(module.hparams.warmup_ratio * steps), steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    device = torch.device("cpu")
    stamps: list[float] = []
    while len(stamps) < steps:
        for batch in loader:
            with autocast_context(precision, device):
                _, logits = module(batch)
                loss = squared_hinge_loss(logits, batch["targets"])
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()  # Lightning reads the loss every step for its logs: same sync here
            stamps.append(time.perf_counter())
            if len(stamps) == steps:
                break
    return stamps


def lightning_loop(
    module: Any, dm: Any, steps: int, precision: str, grad_clip: float | None, log_dir: Path
) -> list[float]:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    class Stamps(pl.Callback):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.stamps.append(time.perf_counter())

    stamps = Stamps()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=steps,
        gradient_clip_val=grad_clip,
        logger=CSVLogger(str(log_dir), name="bench"),
        log_every_n_steps=10,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
        callbacks=[stamps],
    )
    trainer.fit(module, datamodule=dm)
    return stamps.stamps


def cmd_loop(args: argparse.Namespace) -> dict[str, Any]:
    texts, Y, C = reuters_problem(args.clusters, args.seed)
    cfg = matcher_config(args)
    runs: list[dict[str, float]] = []
    for rep in range(args.repeats):
        order = ("bare", "lightning") if rep % 2 == 0 else ("lightning", "bare")
        result: dict[str, float] = {}
        for kind in order:
            module, dm = build(args, cfg, texts, Y, C)
            if kind == "bare":
                stamps = bare_loop(module, dm.train_dataloader(), args.steps, args.precision, cfg.grad_clip)
            else:
                stamps = lightning_loop(module, dm, args.steps, args.precision, cfg.grad_clip, WORK / "logs")
            result[kind] = steps_per_second(stamps, args.warmup)
            print(f"repeat {rep} {kind}: {result[kind]:.3f} steps/s", flush=True)
        result["ratio"] = result["lightning"] / result["bare"]
        runs.append(result)
    ratios = [r["ratio"] for r in runs]
    return {
        "runs": runs,
        "median_ratio": statistics.median(ratios),
        "median_bare_steps_per_s": statistics.median(r["bare"] for r in runs),
        "median_lightning_steps_per_s": statistics.median(r["lightning"] for r in runs),
    }


# --------------------------------------------------------------------------- speed and recall


def encode_speed(module: Any, tokens: Any, precision: str, batch_size: int) -> float:
    from xtransformer.api import EncodeOptions, predict_tokens

    start = time.perf_counter()
    predict_tokens(module, tokens, EncodeOptions(batch_size=batch_size, topb=1, precision=precision, progress=False))
    return len(tokens) / (time.perf_counter() - start)


def cmd_speed(args: argparse.Namespace) -> dict[str, Any]:
    texts, Y, C = reuters_problem(args.clusters, args.seed)
    cfg = matcher_config(args)
    out: dict[str, dict[str, list[float]]] = {}
    for rep in range(args.repeats):
        for precision in args.precisions if rep % 2 == 0 else args.precisions[::-1]:
            module, dm = build(args, cfg, texts, Y, C)
            stamps = bare_loop(module, dm.train_dataloader(), args.steps, precision, cfg.grad_clip)
            test = dm.tokens["test"]
            sub = _subset(test, np.arange(min(args.docs, len(test))))
            entry = out.setdefault(precision, {"train_steps_per_s": [], "encode_docs_per_s": []})
            entry["train_steps_per_s"].append(steps_per_second(stamps, args.warmup))
            entry["encode_docs_per_s"].append(encode_speed(module, sub, precision, args.eval_batch_size))
            print(
                f"repeat {rep} {precision}: {entry['train_steps_per_s'][-1]:.3f} steps/s, "
                f"{entry['encode_docs_per_s'][-1]:.1f} docs/s",
                flush=True,
            )
    return {p: {k: statistics.median(v) for k, v in d.items()} | {"runs": d} for p, d in out.items()}


def _subset(tokens: Any, rows: np.ndarray) -> Any:
    from xtransformer.api import TokenizedTexts

    lengths = tokens.lengths[rows]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([tokens.ids[tokens.offsets[r] : tokens.offsets[r + 1]] for r in rows])
    return TokenizedTexts(ids=ids, offsets=offsets, pad_id=tokens.pad_id, left_pad=tokens.left_pad)


def recall_at(topb: sp.csr_matrix, targets: sp.csr_matrix, bs: list[int]) -> dict[str, float]:
    """recall@b for each b from one shortlist of the top max(bs) scores per row."""
    from xtransformer.api import topb_recall

    out = {}
    n = topb.shape[0]
    width = int(np.diff(topb.indptr).max())
    scores = topb.data.reshape(n, width)
    cols = topb.indices.reshape(n, width)
    order = np.argsort(-scores, axis=1, kind="stable")
    for b in bs:
        keep = np.take_along_axis(cols, order[:, :b], axis=1)
        vals = np.take_along_axis(scores, order[:, :b], axis=1)
        sub = sp.csr_matrix((vals.ravel(), keep.ravel(), np.arange(0, n * b + 1, b)), shape=topb.shape)
        out[f"recall@{b}"] = round(topb_recall(sub, targets), 4)
    return out


def cmd_reuters(args: argparse.Namespace) -> dict[str, Any]:
    import lightning.pytorch as pl

    from xtransformer.api import (
        EncodeOptions,
        LabeledData,
        LoadedMatcher,
        StageCache,
        TrainContext,
        TrainerConfig,
        fine_tune_matcher,
        instance_cluster_targets,
        predict_tokens,
    )

    texts, Y, C = reuters_problem(args.clusters, args.seed)
    targets = instance_cluster_targets(Y["test"], C)
    cfg = matcher_config(args, checkpoint_every_n_steps=100, eval_batch_size=args.eval_batch_size)
    module, dm = build(args, cfg, texts, Y, C)
    start = time.perf_counter()
    options = EncodeOptions(batch_size=args.eval_batch_size, topb=max(args.b), precision=args.precision, progress=False)
    before = predict_tokens(module, dm.tokens["test"], options)
    untrained_docs_per_s = len(dm.tokens["test"]) / (time.perf_counter() - start)

    class Stamps(pl.Callback):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_train_batch_end(self, *a: Any) -> None:
            self.stamps.append(time.perf_counter())

    stamps = Stamps()
    out_dir = WORK / f"reuters-{args.model.replace('/', '_').replace(':', '_')}-{args.precision}-{args.steps}"
    ctx = TrainContext(
        cache=StageCache(out_dir),
        trainer=TrainerConfig(precision=args.precision),
        lightning={
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 10,
        },
        callbacks=[stamps],
    )
    ids = [str(j) for j in range(C.shape[0])]
    start = time.perf_counter()
    folder = fine_tune_matcher(
        ctx,
        "reuters",
        LabeledData.build(texts["train"], Y["train"], ids),
        C,
        cfg,
        LabeledData.build(texts["dev"], Y["dev"], ids),
    )
    train_seconds = time.perf_counter() - start
    matcher = LoadedMatcher.load(folder)
    start = time.perf_counter()
    trained = matcher.encode(texts["test"], options)
    metrics = {
        "train_seconds": train_seconds,
        "global_step": matcher.meta["global_step"],
        "inference_docs_per_s": len(texts["test"]) / (time.perf_counter() - start),
    }
    return {
        "n_clusters": C.shape[1],
        "n_labels": C.shape[0],
        "true_clusters_per_test_doc": round(float(np.diff(targets.indptr).mean()), 3),
        "untrained": recall_at(before.topb, targets, args.b),
        "trained": recall_at(trained.topb, targets, args.b),
        "train_steps_per_s": steps_per_second(stamps.stamps, args.warmup)
        if len(stamps.stamps) > args.warmup + 1
        else None,
        "train_seconds": metrics.get("train_seconds"),
        "global_step": metrics.get("global_step"),
        "inference_docs_per_s": metrics.get("inference_docs_per_s"),
        "untrained_test_docs_per_s": untrained_docs_per_s,
        "out_dir": str(out_dir),
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("loop", "speed", "reuters"))
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps (default: loop 30, speed 12, reuters 300)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of steps/s")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--head-lr", type=float, default=None)
    parser.add_argument("--clusters", type=int, default=32, help="K label clusters (Reuters has 90 labels)")
    parser.add_argument("--b", type=int, nargs="+", default=[1, 3, 5, 10], help="recall@b cut-offs")
    parser.add_argument("--precision", default="32-true", help="loop / reuters precision")
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], help="speed mode")
    parser.add_argument("--docs", type=int, default=512, help="speed mode: test documents encoded")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice); on a busy shared box 1 can beat 2",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps is None:
        args.steps = {"loop": 30, "speed": 12, "reuters": 300}[args.mode]
    if args.steps <= args.warmup + 1:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1})")
    run = {"loop": cmd_loop, "speed": cmd_speed, "reuters": cmd_reuters}[args.mode]
    start = time.perf_counter()
    result = {
        "mode": args.mode,
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "load_average_start": os.getloadavg(),
        **run(args),
    }
    result["wall_seconds"] = time.perf_counter() - start
    result["load_average_end"] = os.getloadavg()
    WORK.mkdir(parents=True, exist_ok=True)
    name = f"{args.mode}-{args.model.replace('/', '_').replace(':', '_')}-{args.precision}.json"
    (WORK / name).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
