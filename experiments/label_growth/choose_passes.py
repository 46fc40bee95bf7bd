"""How many solver passes labels added to a trained model get (``added_max_iter``), and what
sampling their negatives would do instead, chosen on held-out training documents (never dev).

    python -m experiments.label_growth.choose_passes [--holdout 5000] [--seed 0] [--passes 1,2,3,5,100]
    python -m experiments.label_growth.choose_passes --run RUN --embeddings DIR --sampled "" \
        --tag eurlex57k-xrtransformer

The held-out split, the draw, ``full`` and ``reduced`` are ``choose_placement.py``'s. ``reduced``
gets the drawn labels back with the method's default placement (one leaf by routes, trained against
every document, scored alone) under each ``added_max_iter`` of ``--passes`` (dual coordinate descent
passes, at most the model's ``max_iter``, 100). With ``--sampled`` (``RATE:HARD:SLOTS`` items), the
same labels solved to convergence against sampled negatives instead: the new labels in tasks of
``SLOTS``, each task trained on its labels' positives and ``HARD`` documents a label (the nearest to
its PIFA row by cosine) at their own cost, and a seeded uniform ``RATE`` of the other documents at
cost ``1 / RATE`` (a weighted mask: an unbiased estimate of the loss over every document). The choice,
fixed before the runs: the fewest passes whose held-out P@1, P@5 and nDCG@5 are each within 0.3 of
``full`` (the sampled rows are reported, not chosen from). Prints the table and writes
``<results>/label-passes-<tag>.{json,md}``.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from xtransformer.api import added_labels_solver

from ..common import public_args, save_table, selection_parser, trees
from .choose_placement import BAR, GAP_KEYS, growth_options, held_out_growth, scored
from .choose_placement import table as placement_table


def main(argv: list[str] | None = None) -> None:
    ap = selection_parser(__doc__)
    growth_options(ap)
    ap.add_argument("--passes", default="1,2,3,5,100", help="added_max_iter settings to grow with")
    ap.add_argument("--sampled", default="0.1:0:64,0.05:0:64,0.1:1000:64,0.05:1000:8,0.02:500:1",
                    help="sampled negatives to grow with, RATE:HARD:SLOTS items ('' for none)")  # fmt: skip
    args = ap.parse_args(argv)
    setup, dropped, reduced, rows = held_out_growth(args)
    X_fit, Y_fit, ids, names = setup["X_fit"], setup["Y_fit"], setup["ids"], setup["names"]

    def grow(name: str, **row) -> None:
        t0 = time.perf_counter()
        grown = reduced.add_labels(X_fit, Y_fit, label_ids=ids, label_names=names)
        training = grown.training_run.report["added_labels"]["training"]
        row |= {"name": name, "seconds": round(time.perf_counter() - t0, 1), "solver_s": training["total_s"]}
        rows.append(scored(row | {"cd_passes": training["cd_passes"]}, grown, setup["splits"], ids))

    for passes in [int(p) for p in args.passes.split(",")]:
        for tree in trees(reduced):
            tree.config = dataclasses.replace(tree.config, added_max_iter=passes)
        grow(f"{passes} passes", passes=passes)
    for item in [s for s in args.sampled.split(",") if s]:
        rate, hard, slots = float(item.split(":")[0]), *(int(x) for x in item.split(":")[1:])
        trainer = sampled_trainer(rate, hard, slots, args.seed)
        with added_labels_solver(trainer):
            grow(f"sampled: rate {rate}, {hard} nearest, {slots} slots", rate=rate, hard=hard, slots=slots)
    for r in rows[1:]:
        r["gap"] = {k: round(r["holdout"][k] - rows[0]["holdout"][k], 2) for k in GAP_KEYS}
    within = [r for r in rows[1:] if "passes" in r and all(g >= -BAR for g in r["gap"].values())]
    best = min(within, key=lambda r: r["passes"])["name"] if within else "none within the bar"
    record = {"args": public_args(args), "n_dropped": len(dropped), "best": best, "rows": rows}
    save_table(args.results, f"label-passes-{args.tag}", record, table(rows, best))


def sampled_trainer(rate: float, hard: int, slots: int, seed: int):
    """A ``train_one_vs_all`` against sampled negatives (see the module's text); its report adds
    ``rows``, the rows its tasks train on."""
    from xtransformer.api import LevelSpec, solver_params, train_level

    def train(X: sp.csr_matrix, Y: sp.csr_matrix, cfg):
        N, L = Y.shape
        n_tasks = -(-L // slots)
        C = sp.csr_matrix((np.ones(L, np.float32), np.arange(L) * n_tasks // L, np.arange(L + 1)), shape=(L, n_tasks))
        own = sp.csr_matrix(Y, dtype=np.float32) + (nearest(X, Y, hard) if hard else 0)
        exact = (own @ C).toarray() > 0  # N x tasks: rows at their own cost
        sampled = np.random.default_rng(seed).random(N) < rate
        mask = sp.csr_matrix(np.where(exact, 1.0, np.where(sampled[:, None], 1.0 / rate, 0.0)))
        level, info = train_level(X, LevelSpec(Y, C, mask), solver_params(cfg), cfg.bias, cfg.threshold,
                                  cfg.batch_nnz, cfg.n_threads)  # fmt: skip
        return level, info | {"rows": int(mask.nnz)}

    return train


def nearest(X: sp.csr_matrix, Y: sp.csr_matrix, k: int) -> sp.csr_matrix:
    """``N x L``: each label's ``k`` documents nearest its PIFA row (cosine), its positives aside."""
    from xtransformer.api import unit_rows

    Y = sp.csr_matrix(Y, dtype=np.float32)
    S = (X @ unit_rows(sp.csr_matrix(Y.T @ X)).T).toarray()
    S[Y.toarray() > 0] = -np.inf
    top = np.argpartition(-S, k, axis=0)[:k]
    L = Y.shape[1]
    return sp.csr_matrix((np.ones(k * L, np.float32), (top.ravel(), np.tile(np.arange(L), k))), shape=Y.shape)


def table(rows: list[dict], best: str) -> str:
    """``choose_placement.py``'s table, the solver's seconds beside."""
    return placement_table(rows, best, "grown with", ("solver s", solver_cell))


def solver_cell(row: dict) -> str:
    return f"{row['solver_s']:.1f}" if "solver_s" in row else ""


if __name__ == "__main__":
    main()
