"""Kim-CNN and XML-CNN on EURLEX57K on one GPU, at their published recipes (LibMultiLabel's):
the suite's network and LightningModule (``TextCNN``, ``CNNModule``'s parameter groups, fused
AdamW with linear decay, bf16 autocast, BCE over all labels) in a plain loop over the arrays of
``prepare.py``. Every epoch is scored on 5,000 held-out training documents (the best epoch is
chosen there, by P@1 + P@3 + P@5) and on dev (reported). A time budget per model sizes the run:
a 60-step probe times a step, then as many of the recipe's 50 epochs as fit run, with the linear
decay spread over them.

    python -m experiments.cnn_baselines.train_gpu --data DIR --out DIR [--budget kimcnn=250 --budget xmlcnn=150]
    python -m experiments.cnn_baselines.train_gpu --data DIR --out DIR --epochs 5 --lr 1e-3 --lr 2e-3 --max-length 128

Writes ``<out>/<model>.json``: per-epoch scores, the chosen epoch, seconds, predict docs/s.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from xtransformer.api import XMLCNN, CNNConfig, CNNModule, KimCNN, LinearWarmupDecay, TokenizedTexts, evaluate, topb_csr

TOPK, PROBE_STEPS = 20, 70


class Arrays:
    """The prepared splits: tokens, labels, the held-out and fitted training rows, the word table."""

    def __init__(self, folder: Path) -> None:
        z = np.load(folder / "tokens.npz")
        self.n_labels, self.pad = int(z["n_labels"]), int(z["pad_id"])
        self.train, self.Ytrain = self._split(z, "train")
        self.eval, self.Yeval = self._split(z, "eval")
        self.eval_split = str(z["eval_split"])
        self.held, self.fit = z["held"], z["fit"]
        self.table = torch.from_numpy(np.load(folder / "minilm_table.npy").astype(np.float32))

    def _split(self, z: Any, name: str) -> tuple[TokenizedTexts, sp.csr_matrix]:
        tokens = TokenizedTexts(z[f"{name}_ids"].astype(np.int32), z[f"{name}_offsets"], self.pad, False)
        ind = z[f"{name}_Yindices"].astype(np.int64)
        shape = (len(tokens), self.n_labels)
        Y = sp.csr_matrix((np.ones(len(ind), np.float32), ind, z[f"{name}_Yindptr"]), shape=shape)
        return tokens, Y


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def score(module: CNNModule, tokens: TokenizedTexts, rows: np.ndarray, device: torch.device) -> sp.csr_matrix:
    """Top-20 sigmoid scores of ``rows`` (length-sorted batches of 512), as a csr over all labels."""
    order = rows[np.argsort(tokens.lengths[rows])]
    position = {r: i for i, r in enumerate(rows)}
    vals, ids = np.zeros((len(rows), TOPK), np.float32), np.zeros((len(rows), TOPK), np.int64)
    module.eval()
    with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16):
        for s in range(0, len(order), 512):
            chunk = order[s : s + 512]
            batch = {k: v.to(device, non_blocking=True) for k, v in tokens.batch(chunk).items()}
            top = torch.sigmoid(module(batch).float()).topk(TOPK, dim=1)
            at = [position[r] for r in chunk]
            vals[at], ids[at] = top.values.cpu().numpy(), top.indices.cpu().numpy()
    module.train()
    return topb_csr(vals, ids, module.network.output.out_features)


def scores(module: CNNModule, tokens: TokenizedTexts, Y: sp.csr_matrix, rows: np.ndarray, device) -> dict:
    m = evaluate(Y[rows], score(module, tokens, rows, device), max_k=5)
    return {k: round(m[k], 2) for k in ("P@1", "P@3", "P@5", "nDCG@3", "nDCG@5")}


class Run:
    """One network from the initial weights: AdamW over ``CNNModule.param_groups``, BCE, bf16."""

    def __init__(self, data: Arrays, cfg: CNNConfig, device: torch.device, total_steps: int) -> None:
        torch.manual_seed(cfg.seed)
        self.data, self.cfg, self.device = data, cfg, device
        self.module = CNNModule(data.table.clone(), data.n_labels, cfg).to(device)
        fused = device.type == "cuda" or None
        self.opt = torch.optim.AdamW(self.module.param_groups(), lr=cfg.lr, eps=cfg.adam_eps, fused=fused)
        schedule = LinearWarmupDecay(round(cfg.warmup_ratio * total_steps), total_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)

    def step(self, rows: np.ndarray) -> torch.Tensor:
        batch = {k: v.to(self.device, non_blocking=True) for k, v in self.data.train.batch(rows).items()}
        targets = torch.from_numpy(self.data.Ytrain[rows].toarray()).to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, torch.bfloat16):
            logits = self.module(batch)
        loss = F.binary_cross_entropy_with_logits(logits.float(), targets)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        return loss


def seconds_per_step(data: Arrays, cfg: CNNConfig, device: torch.device) -> float:
    """A throw-away run's mean step time over 60 steps after 10 warm-up steps."""
    run, bs = Run(data, cfg, device, 10**6), cfg.batch_size
    probe = np.random.default_rng(cfg.seed).permutation(data.fit)
    for i in range(10):
        run.step(probe[i * bs : (i + 1) * bs])
    sync(device)
    start = time.perf_counter()
    for i in range(10, PROBE_STEPS):
        run.step(probe[i * bs : (i + 1) * bs])
    sync(device)
    return (time.perf_counter() - start) / (PROBE_STEPS - 10)


def train(data: Arrays, cfg: CNNConfig, budget_s: float | None, device: torch.device) -> dict[str, Any]:
    """``cfg.max_epochs`` epochs, or (``budget_s``) as many of them as fit in that many seconds."""
    name, per_epoch, epochs = cfg.name, math.ceil(len(data.fit) / cfg.batch_size), cfg.max_epochs
    per_step = seconds_per_step(data, cfg, device) if budget_s is not None else None
    if per_step is not None:
        epochs = max(1, min(cfg.max_epochs, int(budget_s / (per_step * per_epoch * 1.08))))
    run, rng = Run(data, cfg, device, per_epoch * epochs), np.random.default_rng(cfg.seed)
    log, train_s = [], 0.0
    for epoch in range(epochs):
        sync(device)
        start, perm = time.perf_counter(), rng.permutation(data.fit)
        for s in range(0, len(perm), cfg.batch_size):
            loss = run.step(perm[s : s + cfg.batch_size])
        sync(device)
        train_s += time.perf_counter() - start
        row = {"epoch": epoch + 1, "loss": round(float(loss.detach()), 5), "train_s": round(train_s, 1)}
        row["held"] = scores(run.module, data.train, data.Ytrain, data.held, device)
        row[data.eval_split] = scores(run.module, data.eval, data.Yeval, np.arange(len(data.eval)), device)
        log.append(row)
        print(name, json.dumps(row), flush=True)
    best = max(log, key=lambda r: r["held"]["P@1"] + r["held"]["P@3"] + r["held"]["P@5"])
    sync(device)
    start = time.perf_counter()
    score(run.module, data.eval, np.arange(len(data.eval)), device)
    sync(device)
    keys = ("filter_widths", "feature_maps", "pooling_chunks", "bottleneck", "embed_dropout", "dropout", "lr")
    return {
        "name": name,
        "settings": {k: getattr(cfg, k) for k in (*keys, "batch_size", "max_length")},
        "per_step_s": round(per_step or train_s / (epochs * per_epoch), 5),
        "epochs_run": epochs,
        "recipe_epochs": cfg.max_epochs,
        "best_by_held_out": best,
        "last": log[-1],
        "epochs": log,
        "predict_docs_s_tokens_given": round(len(data.eval) / (time.perf_counter() - start), 1),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="prepare.py's --out")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", action="append", default=[], help="MODEL=SECONDS (default xmlcnn=150 kimcnn=250)")
    ap.add_argument("--epochs", type=int, help="a fixed number of epochs for every model (no budget)")
    ap.add_argument("--lr", type=float, action="append", default=[], help="a grid of learning rates (with --epochs)")
    ap.add_argument("--max-length", type=int, default=500, help="as prepare.py's")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    data, device = Arrays(args.data), torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, budget, lr in runs(args):
        cfg = (KimCNN if name == "kimcnn" else XMLCNN).settings_class().cnn  # the method's recipe
        cfg.max_length, cfg.lr = args.max_length, lr or cfg.lr
        cfg.max_epochs = args.epochs or cfg.max_epochs
        result = train(data, cfg, budget, device)
        tag = f"{name}-lr{lr:g}" if lr else name
        (args.out / f"{tag}.json").write_text(json.dumps(result, indent=1))
        print("RESULT", tag, json.dumps({k: result[k] for k in ("per_step_s", "epochs_run", "best_by_held_out")}))


def runs(args: argparse.Namespace) -> list[tuple[str, float | None, float | None]]:
    """(model, seconds or None, lr or None): the budgets, or every model at every ``--lr``."""
    if args.epochs:
        return [(m, None, lr) for lr in args.lr or [None] for m in ("kimcnn", "xmlcnn")]
    budgets = dict(b.split("=") for b in args.budget) or {"xmlcnn": "150", "kimcnn": "250"}
    return [(m, float(b), None) for m, b in budgets.items()]


if __name__ == "__main__":
    main()
