"""Zero-shot labels on EURLEX57K dev: a finished XR-Transformer run's models with their label texts.

    # RUN: the output folder of `python train.py experiment=eurlex57k_xr` (or _xr_ensemble)
    python -m experiments.label_growth.bench_zero_shot --run RUN [--sample 2000] [--bounds 5:0]

``fit_zero_shot`` is fitted on ``--sample`` seeded training documents for each of the run's two
models (XR-Transformer: the fine-tuned encoder's embeddings of the label names and alternative
names; XR-Linear: their TF-IDF), then every model (each member and the run's combination) scores
the dev split with ``zero_shot_labels`` false and true (the bounds ``zero_shot_per_doc`` and
``zero_shot_floor`` as ``fit_zero_shot`` sets them, and as each ``--bounds PER_DOC:FLOOR`` says).
The table gives P@1 / P@5 / nDCG@5 over all labels and RP@5 / nDCG@5 per label group (Chalkidis
et al. 2020: frequent > 50 training documents, few-shot 1-50, zero-shot none; each group's labels
ranked alone, over the documents with a label in it). Writes ``<results>/zero-shot-<tag>.{json,md}``.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..common import RESULTS, public_args, save_table

GROUPS = ("frequent", "few", "zero")


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished XR-Transformer run (with xrlinear)")
    ap.add_argument("--sample", type=int, default=2000, help="training documents the calibration reads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="eurlex57k")
    ap.add_argument("--bounds", default="", help="more zero_shot_per_doc:zero_shot_floor pairs to score, e.g. 5:0")
    args = ap.parse_args(argv)
    from xtransformer.api import LabeledData, XMCModel, load_dataset

    main_model = XMCModel.load(args.run)  # the run's main method: its combination is "<main>+xrlinear"
    combo = XMCModel.load(args.run, f"{main_model.method}+xrlinear")
    ds = load_dataset(main_model.train_settings["dataset"])
    train, dev = LabeledData.from_split(ds, "train"), ds.splits[ds.eval_split]
    t0 = time.perf_counter()
    combo = combo.fit_zero_shot(train, sample=args.sample, seed=args.seed)
    fit_s = time.perf_counter() - t0
    print(f"zero-shot parts fitted in {fit_s:.0f} s", flush=True)
    preds = member_predictions(combo, dev.texts, bounds_of(args.bounds))
    rows = []
    for name, pred in preds.items():
        rows.append(scores(name, pred, dev.Y, train.Y))
        print(rows[-1], flush=True)
    zero = combo.members[0].zero_shot
    record = {
        "args": public_args(args),
        "fit_s": round(fit_s, 1),
        "n_zero_shot_labels": len(zero.labels),
        "calibration": {
            m.method: {"text": m.zero_shot.text_fit, "score": m.zero_shot.score_fit} for m in combo.members
        },
        "rows": rows,
    }
    save_table(args.results, f"zero-shot-{args.tag}", record, table(record))


def bounds_of(text: str) -> list[dict]:
    """``"5:0,3:0.1"`` as prediction settings; first the defaults ``fit_zero_shot`` wrote (none)."""
    out: list[dict] = [{}]
    for pair in filter(None, text.split(",")):
        per_doc, _, floor = pair.partition(":")
        out.append({"zero_shot_per_doc": int(per_doc), "zero_shot_floor": float(floor or 0)})
    return out


def member_predictions(combo, texts: list[str], bounds: list[dict]) -> dict:
    """Each member's dev scores with ``zero_shot_labels`` false, and true under each of ``bounds``,
    and the combination's of each (``combine``: what the combination's ``predict`` does with its
    members' scores)."""
    out = {}
    for calls in [{"zero_shot_labels": False}, *({"zero_shot_labels": True} | b for b in bounds)]:
        parts = []
        name = label(calls, combo.predict_settings)
        for m in combo.members:
            topk = max(int(combo.predict_settings["topk"]), int(m.predict_settings["topk"]))
            t0 = time.perf_counter()
            parts.append(m.predict_csr(texts, topk=topk, **calls))
            print(f"{m.method} {name}: {time.perf_counter() - t0:.0f} s", flush=True)
            out[(m.method, name)] = parts[-1]
        out[(combo.method, name)] = combo.combine(parts, **calls)
    return out


def label(calls: dict, defaults: dict) -> str:
    """How a row names its zero-shot settings: false, or true with its bounds."""
    if not calls["zero_shot_labels"]:
        return "false"
    both = {**defaults, **calls}
    return f"true ({both['zero_shot_per_doc']} a doc, floor {both['zero_shot_floor']:g})"


def scores(name: tuple[str, str], pred, Y, train_Y) -> dict:
    from xtransformer.api import evaluate, group_metrics

    overall = evaluate(Y, pred)
    groups = group_metrics(Y, pred, train_Y.getnnz(axis=0))
    out = {"method": name[0], "zero_shot_labels": name[1]}
    out |= {k: round(overall[k], 2) for k in ("P@1", "P@5", "nDCG@5")}
    for g in GROUPS:
        out |= {f"{g}/{k}": round(groups[g].get(k, 0.0), 2) for k in ("RP@5", "nDCG@5")}
        out[f"{g}/n"] = f"{groups[g]['n_labels']} labels, {groups[g]['n_docs']} docs"
    return out


def table(record: dict) -> str:
    head = "| method | zero_shot_labels | P@1 | P@5 | nDCG@5 | " + " | ".join(f"{g} RP@5 | {g} nDCG@5" for g in GROUPS)
    lines = [head + " |", "|" + "---|" * (5 + 2 * len(GROUPS))]
    for r in record["rows"]:
        cells = [r["method"], str(r["zero_shot_labels"]).lower(), *(f"{r[k]:.2f}" for k in ("P@1", "P@5", "nDCG@5"))]
        cells += [f"{r[f'{g}/{k}']:.2f}" for g in GROUPS for k in ("RP@5", "nDCG@5")]
        lines.append("| " + " | ".join(cells) + " |")
    r0 = record["rows"][0]
    lines.append("\n" + "; ".join(f"{g}: {r0[f'{g}/n']}" for g in GROUPS) + f"; fitted in {record['fit_s']} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
