"""The final model's cost of a negative (``Cn``), chosen on dev, re-checked on held-out training documents.

    # RUN: the output folder of a calibrated run, e.g.
    #   python train.py experiment=eurlex57k_xr_ensemble calibration=isotonic calibration.holdout=1000
    python -m experiments.xr_budget.check_final_costs --run RUN [--embeddings DIR] [--holdout 5000] [--cn 1,2]

``experiment=eurlex57k_xr_ensemble`` sets ``xrtransformer.final.model.Cn: 2`` (chosen on dev over
five encoders). Here the run's final model is refitted (``XRLinear.fit`` with the run's final-model
settings, ``Cn`` changed) on the run's own rows (TF-IDF ⊕ its fine-tuned encoder's embeddings) of
its training documents less ``--holdout`` seeded ones, once per ``--cn``. Each model scores those
held-out documents (the choice: best P@1 + P@3 + P@5 there), the documents the run held out of
every model (``unseen``: its encoder never read them; reported) and dev (reported only). The
encoder was fine-tuned on the ``--holdout`` documents, so they are a little easier than new ones.
Prints the table and writes ``<results>/final-costs-<tag>.{json,md}``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..common import (
    final_model_rows,
    fit_rows,
    held_out_total,
    holdout_rows,
    public_args,
    rounded,
    save_table,
    selection_parser,
)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import evaluate

    ap = selection_parser(__doc__)
    ap.add_argument("--run", type=Path, required=True, help="output folder of a finished XR-Transformer run")
    ap.add_argument(
        "--embeddings",
        type=Path,
        default=None,
        help="a folder with the run's own embeddings (train.npy / dev.npy) instead of encoding again",
    )
    ap.add_argument("--cn", default="1,2", help="costs of a negative to try (comma list)")
    args = ap.parse_args(argv)
    r = final_model_rows(args.run, args.embeddings)
    fitted, held = holdout_rows(r.X_train.shape[0], args.holdout, args.seed)
    Y = r.train.Y.tocsr()
    splits = {"holdout": (r.X_train[held], Y[held]), "dev": (r.X_eval, r.eval_Y)}
    if r.held is not None:
        splits["unseen"] = (r.X_held, r.held.Y)
    print(f"{len(fitted)} fitted, {len(held)} held out; splits {sorted(splits)}", flush=True)
    rows = []
    for cn in [float(x) for x in args.cn.split(",")]:
        config = dataclasses.replace(r.config, model=dataclasses.replace(r.config.model, Cn=cn))
        t0 = time.perf_counter()
        model = fit_rows(r.X_train[fitted], Y[fitted], r.train.label_ids, config)
        row = {"Cn": cn, "Cp": config.model.Cp, "fit_s": round(time.perf_counter() - t0, 1)}
        for name, (X, Yt) in splits.items():
            row[name] = rounded(evaluate(Yt, model.predict_features_csr(X)))
        print(row, flush=True)
        rows.append(row)
    best = max(rows, key=held_out_total)["Cn"]
    record = {"args": public_args(args), "run_Cn": r.config.model.Cn, "best": best, "rows": rows}
    save_table(args.results, f"final-costs-{args.tag}", record, table(rows, best, "unseen" in splits))


def table(rows: list[dict], best: float, unseen: bool) -> str:
    def cells(m: dict) -> str:
        return f"{m['P@1']:.2f} / {m['P@3']:.2f} / {m['P@5']:.2f} | {m['nDCG@5']:.2f}"

    split = "P@1 / P@3 / P@5 | nDCG@5"
    head = f"| Cp / Cn | held-out {split} | unseen {split} | dev {split} | fit s |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{r['Cp']:g} / {r['Cn']:g}"
        name = f"**{name}**" if r["Cn"] == best else name
        mid = cells(r["unseen"]) if unseen else "– | –"
        lines.append(f"| {name} | {cells(r['holdout'])} | {mid} | {cells(r['dev'])} | {r['fit_s']:.1f} |")
    return "\n".join(lines) + f"\n\nchosen on the held-out documents (P@1 + P@3 + P@5): Cn {best:g}"


if __name__ == "__main__":
    main()
