"""Command-line entry points: ``python -m xtransformer {train,predict,serve,add-labels,data,ensemble,push}``
and the console scripts ``xmc-train``, ``xmc-predict``, ``xmc-serve``, ``xmc-add-labels`` (``xmc-data``:
``data/command.py``).

Only ``train`` imports Hydra / Lightning: predicting with a linear model must stay light.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from xtransformer.configuration import config_dir
from xtransformer.errors import UserError
from xtransformer.utils.hardware import DEVICE_HELP, DEVICES


class CLIError(ValueError):
    """Bad command-line input; printed as one line."""


# ---------------------------------------------------------------------------------------------- train
class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def _quiet_lightning_logging() -> None:
    """Lightning gives its loggers their own console handler; Hydra's root handler already prints and
    files every record, so without this each Lightning line appears twice."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.addFilter(_DropAdverts())
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


def _train(cfg: Any) -> float | None:
    import lightning.pytorch  # noqa: F401  (import first: it installs the handlers removed next)

    from xtransformer.pipeline.run import run

    _quiet_lightning_logging()

    try:
        metrics = run(cfg)
    except UserError as err:  # a bad setting or input: its message says what to fix, no traceback
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        logging.getLogger("xtransformer").error("%s", err)
        wandb = sys.modules.get("wandb")  # its exit summary would otherwise print below the error
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish(exit_code=1, quiet=True)
        sys.exit(f"error: {err}")
    # the returned value is what Hydra sweepers optimise
    return metrics.get("metrics", {}).get("P@1") if metrics else None


def train_main(argv: Sequence[str] | None = None) -> None:
    """``xmc-train key=value ...``: the Hydra training job (``--help`` lists the config groups)."""
    import hydra

    from xtransformer.configuration import composition_error, register

    if argv is not None:  # Hydra reads sys.argv itself
        sys.argv = [sys.argv[0], *argv]
    problem = composition_error(sys.argv[1:])
    if problem is not None and os.environ.get("HYDRA_FULL_ERROR") != "1":
        sys.exit(f"error: {problem}")
    register()  # the records' base nodes, for Hydra (composition_error registers them only when it checks)
    hydra.main(config_path=config_dir(), config_name="train", version_base="1.3")(_train)()


# ---------------------------------------------------------------------------------------------- predict
def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, one document a line (LF, CRLF or CR-only line ends; a
    leading BOM dropped, as the training data reader does); a bad byte names its line."""
    stream = sys.stdin.buffer if str(path) == "-" else open(path, "rb")  # noqa: SIM115 (closed below; stdin stays)
    n = 0
    try:
        for raw in stream:
            for part in raw.rstrip(b"\n").rstrip(b"\r").split(b"\r"):  # a CR-only file is one raw line
                n += 1
                if n == 1 and part.startswith(b"\xef\xbb\xbf"):
                    part = part[3:]
                try:
                    yield n, part.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise CLIError(f"{path}:{n}: not UTF-8 ({e.reason} at byte {e.start})") from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _chunks(it: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _count_lines(path: str) -> int | None:
    if path == "-":
        return None
    with open(path, "rb") as fh:
        return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise CLIError(f"--set takes key=value, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # plain strings such as post_processor names
    return out


def _format_row(row: dict[str, Any], fmt: str) -> str:
    if fmt == "jsonl":
        return json.dumps(row, ensure_ascii=False)
    values = row.get("probabilities", row["scores"])  # a calibrated model's probabilities
    return "\t".join(f"{label}:{value:.6g}" for label, value in zip(row["labels"], values))


def _label_matrix(lines: list[tuple[int, str]], index: dict[str, int], n_labels: int) -> tuple[Any, int]:
    import numpy as np
    import scipy.sparse as sp

    rows, cols, unknown = [], [], 0
    for i, (_, text) in enumerate(lines):
        for label in text.split():
            if label in index:
                rows.append(i)
                cols.append(index[label])
            else:
                unknown += 1
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(lines), n_labels))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return Y, unknown


def predict_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="xmc-predict",
        description="Predict labels for texts (one UTF-8 document a line) with a saved model folder; "
        "with --labels also print P@k / R@k / nDCG@k / RP@5 (and the F1 scores of decided label sets).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="a method folder (run/model/<method>), a run's model/ folder "
        "or a run folder (then --method, default the run's main method), or hf://owner/name[@revision][/subfolder]",
    )
    p.add_argument("--method", default=None, help="xrlinear | xtransformer | xtransformer+xrlinear | ...")
    p.add_argument("--input", required=True, help="texts, one document a line ('-' reads stdin)")
    p.add_argument("--labels", default=None, help="true labels, space-separated ids a line, aligned with --input")
    p.add_argument("--k", type=int, default=5, help="labels per document in the output (default 5)")
    p.add_argument(
        "--format",
        choices=("jsonl", "tsv"),
        default="jsonl",
        help="jsonl: {labels, names, scores} a line; tsv: label:score pairs, tab-separated",
    )
    p.add_argument("--output", default=None, help="output file (default stdout)")
    p.add_argument("--chunk-size", type=int, default=4096, help="documents predicted together (memory bound)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a prediction setting of the model, e.g. --set beam_size=20 (repeatable)",
    )
    decisions = p.add_argument_group(
        "decisions (a calibrated model: trained with calibration=platt, or model.calibrate(...))",
        "the decided labels of each document instead of its k best, each with its probability",
    )
    decisions.add_argument(
        "--decision",
        choices=("topk", "threshold", "per_label"),
        default=None,
        help="topk: the k best (default); threshold: every label whose probability reaches --threshold "
        "(default: the folder's, tuned on held-out documents); per_label: each label's own tuned threshold",
    )
    decisions.add_argument(
        "--threshold", type=float, default=None, help="a probability in [0, 1] (implies --decision threshold)"
    )
    decisions.add_argument(
        "--min-labels", type=int, default=None, help="labels a document always gets (its most probable)"
    )
    decisions.add_argument("--max-labels", type=int, default=None, help="labels a document gets at most")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model's files")
    p.add_argument("--device", choices=DEVICES, default=None, help=DEVICE_HELP)
    return _one_line_errors("xmc-predict", _predict, p.parse_args(argv))


def _one_line_errors(prog: str, command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``command(args)``; bad input (a model, data or file error) as one line on stderr, exit 2."""
    try:
        return command(args)
    except (CLIError, ValueError, OSError) as e:  # ModelError / DataError are ValueErrors
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def _predict(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from xtransformer.model import XMCModel
    from xtransformer.topk import topk_csr

    if args.k < 1 or args.chunk_size < 1:
        raise CLIError("--k and --chunk-size must be >= 1")
    overrides = _parse_overrides(args.overrides) | _decision_flags(args)
    model = XMCModel.load(args.model, method=args.method, verify=not args.no_verify, device=args.device)
    settings = model.settings(overrides)  # unknown settings and bad decision values fail before any work
    deciding = model.decides and settings["decision"] != "topk"
    want = max(args.k, 5)  # metrics report up to @5
    texts = read_lines(args.input)
    labels = read_lines(args.labels) if args.labels else None
    index = {label: i for i, label in enumerate(model.label_ids)}
    kept, truth, decided, unknown = [], [], [], 0
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115 (closed below)
    bar = tqdm(
        total=_count_lines(args.input), unit="doc", desc="xmc-predict", disable=args.no_progress, file=sys.stderr
    )
    try:
        for chunk in _chunks(texts, args.chunk_size):
            pred = model.predict_csr([t for _, t in chunk], **model.overrides_for_k(want, overrides))
            rows = model.label_rows(pred, args.k, settings)
            for row in rows:
                out.write(_format_row(row, args.format) + "\n")
            if labels is not None:
                lab = list(itertools.islice(labels, len(chunk)))
                if len(lab) != len(chunk):
                    raise CLIError(f"{args.labels}: {len(lab) + chunk[0][0] - 1} lines, fewer than {args.input}")
                Y, bad = _label_matrix(lab, index, model.n_labels)
                truth.append(Y)
                unknown += bad
                kept.append(topk_csr(pred, want))
                if deciding:
                    decided.append(_rows_csr(rows, index, model.n_labels))
            bar.update(len(chunk))
    finally:
        bar.close()
        if out is not sys.stdout:
            out.close()
    if labels is not None:
        if next(labels, None) is not None:
            raise CLIError(f"{args.labels}: more lines than {args.input}")
        _report_metrics(truth, kept, decided, unknown, args.output is None)
    return 0


def _decision_flags(args: argparse.Namespace) -> dict[str, Any]:
    """--decision / --threshold / --min-labels / --max-labels as prediction settings (None: the folder's)."""
    flags = {"decision": args.decision, "threshold": args.threshold}
    flags |= {"min_labels": args.min_labels, "max_labels": args.max_labels}
    return {k: v for k, v in flags.items() if v is not None}


def _rows_csr(rows: list[dict[str, Any]], index: dict[str, int], n_labels: int) -> Any:
    """The label sets of output rows as a binary csr (what the F1 scores read)."""
    import numpy as np
    import scipy.sparse as sp

    cols = [index[label] for row in rows for label in row["labels"]]
    indptr = np.concatenate([[0], np.cumsum([len(row["labels"]) for row in rows])])
    return sp.csr_matrix((np.ones(len(cols), np.float32), cols, indptr), shape=(len(rows), n_labels))


def _report_metrics(truth: list[Any], kept: list[Any], decided: list[Any], unknown: int, to_stderr: bool) -> None:
    import scipy.sparse as sp

    from xtransformer.metrics import decision_f1, evaluate, format_metrics_table

    if not truth:
        raise CLIError("no documents to evaluate")
    Y = sp.vstack(truth, format="csr")
    res = evaluate(Y, sp.vstack(kept, format="csr"))
    keys = [f"{m}@{k}" for m in ("P", "R", "nDCG") for k in (1, 3, 5)] + ["RP@5"]
    if decided:  # the F1 scores of the decided label sets
        res |= decision_f1(Y, sp.vstack(decided, format="csr"))
        keys += ["micro-F1", "macro-F1", "example-F1"]
    line = format_metrics_table(res, keys)
    if unknown:
        line += f"\n({unknown} label ids not in the model's vocabulary counted as misses)"
    print(line, file=sys.stderr if to_stderr else sys.stdout)


# ---------------------------------------------------------------------------------------------- add labels
def add_labels_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="xmc-add-labels",
        description="Add labels to a trained model without retraining it: each new label is placed in the "
        "tree and its ranker trained against the documents given (or those of its leaves); a new model folder "
        "is written and the old one left as it is (old labels score exactly as before).",
    )
    p.add_argument("--model", required=True, help="a method folder, a run's model/ folder, a run folder or hf://...")
    p.add_argument("--method", default=None, help="which model of a run (default: its main method)")
    p.add_argument(
        "--data", required=True, help="a data folder: {split}_texts.txt, {split}_labels.txt[, label_text.txt]"
    )
    p.add_argument("--split", default="train", help="which files of --data (default train)")
    p.add_argument("--new-labels", default=None, help="the ids to add, one a line (default: every id the model lacks)")
    p.add_argument("--output", required=True, help="the new model folder (must not exist yet)")
    p.add_argument(
        "--placement",
        choices=("centroid", "routes"),
        default=None,
        help="where a new label goes: the leaves whose centroids are nearest it or those the model's beam "
        "reaches most often from its documents (default: the method's own, routes for xrlinear and "
        "xrtransformer, else centroid)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=None,
        help="leaves per new label (default the method's: 1 for xrlinear and xrtransformer, else 2; or the tree's λ)",
    )
    p.add_argument(
        "--negatives",
        choices=("all", "leaf"),
        default=None,
        help="what a new label trains against in a tree model (xrlinear, xrtransformer): every document given, "
        "once a label, or the documents of each of its leaves (default: the model's added_negatives, all)",
    )
    p.add_argument(
        "--cache",
        default=None,
        help="the stage cache of the run that trained the model (train.py's paths.cache_dir, default cache/): "
        "the TF-IDF rows and embeddings it computed for documents of --data are taken, not computed again",
    )
    p.add_argument(
        "--zero-shot",
        action="store_true",
        help="instead: score the model's labels that no document of --data carries from their names "
        "(label_text.txt), calibrated on those documents (prediction setting zero_shot_labels)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model's files")
    return _one_line_errors("xmc-add-labels", _add_labels, p.parse_args(argv))


def _add_labels(args: argparse.Namespace) -> int:
    from xtransformer.methods.abilities import Ability, require
    from xtransformer.methods.adding import read_folder, read_new_labels
    from xtransformer.model import XMCModel

    output = Path(args.output).resolve()
    if output.exists():
        raise CLIError(f"--output {args.output}: exists; the grown model goes to a new folder")
    model = XMCModel.load(args.model, method=args.method, verify=not args.no_verify)
    if model.folder is not None and output.is_relative_to(model.folder.resolve()):
        raise CLIError(f"--output {args.output}: inside the model folder, which stays untouched")
    require(model, Ability.ZERO_SHOT if args.zero_shot else Ability.ADD_LABELS, str(model.folder))  # before any data
    if args.zero_shot:
        return _zero_shot(model, args, output)
    new = read_new_labels(args.new_labels) if args.new_labels else None
    how = {"new_labels": new, "placement": args.placement, "leaves": args.leaves, "negatives": args.negatives}
    grown = model.add_labels(read_folder(args.data, args.split), cache=args.cache, **how)
    grown.save(output)
    facts = grown.training_run.report["added_labels"]
    print(
        f"xmc-add-labels: {facts['n_added']} labels added from {facts['n_docs']} documents in "
        f"{facts['seconds']:.1f} s: {model.n_labels} -> {grown.n_labels} labels, saved to {output}",
        file=sys.stderr,
    )
    return 0


def _zero_shot(model: Any, args: argparse.Namespace, output: Path) -> int:
    from xtransformer.methods.adding import zero_shot_data

    data = zero_shot_data(args.data, args.split, model.label_ids, model.label_names)
    for part in [model, *getattr(model, "members", [])]:  # a combination's members read the names too
        part.label_names = data.label_names
    model = model.fit_zero_shot(data)
    model.save(output)
    n = len(model.zero_shot.labels) if model.zero_shot is not None else "their"
    print(f"xmc-add-labels: {n} labels without documents scored from their text, saved to {output}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------- serve
def serve_main(argv: Sequence[str] | None = None) -> int:
    from xtransformer.serve import main

    return main(argv)


# ---------------------------------------------------------------------------------------------- push
def push_main(argv: Sequence[str] | None = None) -> int:
    from xtransformer.model.hub import push_command, push_parser

    return _one_line_errors("xmc-push", push_command, push_parser().parse_args(argv))


# ---------------------------------------------------------------------------------------------- dispatch
COMMANDS = {
    "train": "train a model (Hydra: xmc-train key=value ...; --help lists the options)",
    "predict": "predict labels for a text file with a saved model folder",
    "serve": "serve a saved model folder over HTTP (FastAPI)",
    "add-labels": "add labels to a saved model folder, writing a new one",
    "data": "list the named datasets, or download one (xmc-data get NAME)",
    "ensemble": "combine the predictions of several finished runs",
    "push": "upload a model folder or a run's models to the Hugging Face Hub",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        usage = (
            "usage: python -m xtransformer {"
            + ",".join(COMMANDS)
            + "} [options]\n\n"
            + "\n".join(f"  {name:<9} {text}" for name, text in COMMANDS.items())
        )
        print(usage, file=sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        train_main(rest)
        return 0
    if command == "predict":
        return predict_main(rest)
    if command == "serve":
        return serve_main(rest)
    if command == "add-labels":
        return add_labels_main(rest)
    if command == "push":
        return push_main(rest)
    if command == "data":
        from xtransformer.data.command import main as data_main

        return data_main(rest)
    from xtransformer.ensemble import main as ensemble_main

    return ensemble_main(rest)


def predict_entry() -> None:
    sys.exit(predict_main())


def serve_entry() -> None:
    sys.exit(serve_main())


def add_labels_entry() -> None:
    sys.exit(add_labels_main())


if __name__ == "__main__":
    sys.exit(main())
