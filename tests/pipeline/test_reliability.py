"""Reliability table: bad settings, bad data files, a damaged cache and runs killed in
each stage, each run through the real entry point, asserting the exit code, that the LAST line of
stderr is the one-line message naming the fault (the key, or the file and line), that no Python
traceback was printed, and that a failure came before any stage wrote to the cache. Rows that must
succeed (a trap that is now handled, such as a UTF-8 BOM; a corrupt artifact that is rebuilt; a
rerun after a kill) assert their outcome instead: the warning, and the same metrics as a clean run.

A row is data: its overrides, an optional ``setup`` that changes this row's private copy of the
small data set or its cache before the run (``ctx.run`` runs an earlier job first, for cache and
kill rows; kills use ``XMC_KILL_IN_STAGE``, a SIGKILL before the stage's folder is committed), the
expected code and message, and an optional ``check`` of a finished run.

Speed: every row runs in a child forked from a forkserver that imported Hydra, Lightning and the
pipeline once (~0.5 s a row instead of ~10 s of imports); the rows marked ``subprocess`` run
``python train.py`` itself, to keep the two paths honest.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every row starts Hydra (and most Lightning) in a child process

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
ENV = {
    "WANDB_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
N_TRAIN, N_TEST = 200, 60  # the small Reuters slice every row starts from


# ------------------------------------------------------------------------------------------ running
@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def tail(self) -> str:
        return f"exit {self.code}\n--- stdout (end)\n{self.stdout[-2000:]}\n--- stderr (end)\n{self.stderr[-3000:]}"


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """A forked row: stdout/stderr into files, then the entry point as ``python train.py`` runs
    it. multiprocessing ends the child as the interpreter would: ``sys.exit("error: ...")``
    prints its message and exits 1, an uncaught exception prints its traceback."""
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(cwd)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.environ.update(env)
    from xtransformer.cli import train_main

    train_main(argv)


_HEAVY = ["xtransformer.cli", "xtransformer.pipeline.run", "lightning.pytorch", "transformers", "hydra"]


def run_train(argv: list[str], cwd: Path, env: dict[str, str] | None = None, real_process: bool = False) -> Result:
    env = {**ENV, **(env or {})}
    if real_process:
        import xtransformer  # this checkout's package, whatever the cwd (PYTHONPATH may be relative)

        src = str(Path(xtransformer.__file__).resolve().parents[1])
        full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | env | {"PYTHONPATH": src}
        res = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *argv],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        return Result(res.returncode, res.stdout, res.stderr)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, *_HEAVY])
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    proc = ctx.Process(target=_child, args=(argv, str(cwd), env, str(out), str(err)))
    proc.start()
    proc.join(TIMEOUT_S)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        pytest.fail(f"{argv} ran past {TIMEOUT_S} s")
    return Result(proc.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"))


# ------------------------------------------------------------------------------------------ the data
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Shared:
    return make_shared(tmp_path_factory.mktemp("reliability"))


def make_shared(root: Path) -> Shared:
    """The first N_TRAIN train / N_TEST test documents of Reuters-21578, its label map and names."""
    from xtransformer.data import DataConfig, resolve_dataset_dir

    full = resolve_dataset_dir(DataConfig(name="reuters21578"), cache_dir=root / "unpacked")
    small = root / "small"
    small.mkdir()
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        for kind in ("texts", "labels", "ids"):
            lines = (full / f"{split}_{kind}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
            (small / f"{split}_{kind}.txt").write_text("".join(lines[:n]), encoding="utf-8")
    for name in ("label_map.txt", "label_text.txt"):
        shutil.copy(full / name, small / name)
    return Shared(root, small)


@dataclass
class Shared:
    root: Path
    small: Path
    _reference: dict | None = None

    def reference(self) -> dict:
        """metrics.json of XR-Linear on the untouched slice (rows whose input must read alike)."""
        if self._reference is None:
            ctx = Ctx(self, self.small, self.root / "reference")
            res = ctx.run("method=xrlinear")
            assert res.code == 0, res.tail()
            self._reference = ctx.metrics()
        return self._reference


@dataclass
class Ctx:
    shared: Shared
    data: Path  # this row's data folder: a private copy when the row has a setup
    work: Path  # cwd, cache and run folder of this row

    @property
    def cache(self) -> Path:
        return self.work / "cache"

    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    def argv(self, overrides: tuple[str, ...], drop: tuple[str, ...] = ()) -> list[str]:
        base = {
            "data": "custom",
            "data.path": str(self.data),
            "data.name": "small",
            "logger": "none",
            "model_scale": "small",
            "matcher": "tiny_bert",
            "matcher.max_steps": "2",
            "matcher.batch_size": "16",
            "matcher.max_length": "32",
            "matcher.progress": "false",
            "indexing.n_clusters": "8",
            "tfidf.max_features": "2000",
            "paths.cache_dir": str(self.cache),
            "hydra.run.dir": str(self.run_dir),
        }
        for key in (*drop, *(o.split("=", 1)[0] for o in overrides)):  # a row's own value wins
            base.pop(key, None)
        return [f"{k}={v}" for k, v in base.items()] + list(overrides)

    def run(
        self, *overrides: str, drop: tuple[str, ...] = (), env: dict[str, str] | None = None, real_process: bool = False
    ) -> Result:
        self.work.mkdir(parents=True, exist_ok=True)
        return run_train(self.argv(overrides, drop), self.work, env, real_process)

    def metrics(self) -> dict:
        return json.loads((self.run_dir / "metrics.json").read_text())

    def stages_written(self) -> list[str]:
        """What of the pipeline's work reached the cache (TF-IDF, stage artifacts, tokens)."""
        return (
            sorted(p.name for p in self.cache.iterdir() if p.name in ("tfidf", "stages", "tokens"))
            if self.cache.is_dir()
            else []
        )


# ------------------------------------------------------------------------------------------ the rows
# A cache or kill row is a setup that runs the job once and then damages what it left, e.g.
#   def corrupt_ranker(ctx):                      # a first run fills ctx.cache
#       assert ctx.run().code == 0
#       ...flip bytes of an artifact under ctx.cache / "stages" / "ranker"...
#   Case("ranker artifact corrupted", code=0, setup=corrupt_ranker, message=r"WARNING\].*ranker.*rebuilt",
#        check=<same metrics as the first run>)
@dataclass(frozen=True)
class Case:
    id: str
    overrides: tuple[str, ...] = ()
    message: str = ""  # regex: searched in the last stderr line; for code 0, in the run's log (stdout)
    code: int = 1
    setup: Callable[[Ctx], None] | None = None
    check: Callable[[Ctx, Result], None] | None = None
    drop: tuple[str, ...] = ()  # base overrides left out, by key (a user who never set them)
    env: dict[str, str] = field(default_factory=dict)
    early: bool = True  # a failure must come before TF-IDF or any stage wrote to the cache
    xfail: str | None = None
    skip_if: Callable[[], str | None] | None = None
    real_process: bool = False


def edit(name: str, change: Callable[[bytes], bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.data / name
        path.write_bytes(change(path.read_bytes()))

    return setup


def edit_all(change: Callable[[bytes], bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for path in ctx.data.glob("*.txt"):
            path.write_bytes(change(path.read_bytes()))

    return setup


def set_line(name: str, line: int, text: str) -> Callable[[Ctx], None]:
    def change(raw: bytes) -> bytes:
        lines = raw.decode("utf-8").split("\n")
        lines[line - 1] = text
        return "\n".join(lines).encode("utf-8")

    return edit(name, change)


def drop_last_line(raw: bytes) -> bytes:
    return b"".join(raw.splitlines(keepends=True)[:-1])


def delete(*names: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for name in names or [p.name for p in ctx.data.iterdir()]:
            (ctx.data / name).unlink()

    return setup


def both(*setups: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for s in setups:
            s(ctx)

    return setup


def xc_files(ctx: Ctx) -> None:
    """Feature-only data (the XC sparse format, like bibtex): no texts."""
    delete()(ctx)
    for split, n in (("train", 60), ("test", 20)):
        rows = [f"{i % 20},{(i + 2) % 20} {i % 7}:1.0 {7 + i % 11}:0.5" for i in range(n)]
        (ctx.data / f"{split}.txt").write_text(f"{n} 20 20\n" + "\n".join(rows) + "\n")


def ten_labels(ctx: Ctx) -> None:
    """A custom data set of 10 labels (fewer than the default run's K = 16), no label map."""
    delete("label_map.txt", "label_text.txt")(ctx)
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        (ctx.data / f"{split}_labels.txt").write_text("".join(f"c{i % 10} c{(i * 3) % 10}\n" for i in range(n)))


def unseen_test_labels(ctx: Ctx) -> None:
    """Every test document's labels replaced by ids no training document has."""
    with open(ctx.data / "label_map.txt", "a") as fh:
        fh.write("new_a\nnew_b\n")
    (ctx.data / "test_labels.txt").write_text("".join("new_a new_b\n" if i % 2 else "new_a\n" for i in range(N_TEST)))


def same_as_reference(ctx: Ctx, res: Result) -> None:
    """The changed files read exactly as the untouched ones: same labels, same scores."""
    got, ref = ctx.metrics(), ctx.shared.reference()
    assert got["results"] == ref["results"]
    assert got["dataset_summary"]["n_labels"] == ref["dataset_summary"]["n_labels"] == 90
    vocab = (ctx.run_dir / "label_vocab.txt").read_text(encoding="utf-8")
    assert "\ufeff" not in vocab and vocab == (ctx.shared.root / "reference" / "run" / "label_vocab.txt").read_text()


def unseen_reported(ctx: Ctx, res: Result) -> None:
    unseen = ctx.metrics()["unseen_eval_labels"]
    assert unseen == {
        "split": "test",
        "labels": 2,
        "positives": N_TEST * 3 // 2,
        "docs": N_TEST,
        "docs_only_unseen": N_TEST,
        "n_docs": N_TEST,
    }
    assert ctx.metrics()["metrics"]["P@1"] == 0.0


def no_gpu() -> str | None:
    import torch

    return "this machine has a GPU" if torch.cuda.is_available() else None


def setting(id: str, *overrides: str, message: str, xfail: str | None = None, **kw) -> Case:
    return Case(id, overrides, message=message, xfail=xfail, **kw)


# What a bad value must say: the key (and the value) on the last line, after "error: ".
def names(key: str, value: str = "") -> str:
    return rf"^error: .*{re.escape(key)}\b.*{re.escape(value)}"


SETTINGS = [
    setting("ranker.negatives=foo", "ranker.negatives=foo", message=names("ranker.negatives", "foo")),
    setting("indexing.n_copies=0", "indexing.n_copies=0", message=names("indexing.n_copies", "0")),
    setting(
        "indexing.n_copies above K",
        "indexing.n_copies=9",
        message=r"^error: indexing\.n_copies=9:? is above the number of leaf clusters",
    ),
    setting("indexing.merge=median", "indexing.merge=median", message=names("indexing.merge", "median")),
    setting("matcher.max_steps=abc", "matcher.max_steps=abc", message=names("matcher.max_steps", "abc")),
    setting("seed=abc", "seed=abc", message=names("seed", "abc")),
    setting("trainer.devices=0", "trainer.devices=0", message=names("trainer.devices", "0")),
    setting("trainer=gpu without a GPU", "trainer=gpu", message=r"^error: .*trainer\.accelerator.*gpu", skip_if=no_gpu),
    setting("trainer.precision=fp8", "trainer.precision=fp8", message=names("trainer.precision", "fp8")),
    setting("indexing.n_clusters=1", "indexing.n_clusters=1", message=names("n_clusters", "1")),
    setting("indexing.n_clusters=abc", "indexing.n_clusters=abc", message=names("n_clusters", "abc")),
    setting(
        "n_clusters with max_leaf_size",
        "indexing.max_leaf_size=4",
        message=r"^error: .*at most one of .*n_clusters.* and .*max_leaf_size",
    ),
    setting("unknown key in a group", "ranker.no_such_key=1", message=names("ranker.no_such_key")),
    setting("unknown top-level key", "no_such_key=1", message=names("no_such_key")),
    setting("unknown matcher option", "matcher=no_such_matcher", message=r"^error: .*matcher.*no_such_matcher"),
    setting("method=foo", "method=foo", message=r"^error: .*method.*foo"),
    setting(
        "combine_with_xrlinear=median", "combine_with_xrlinear=median", message=names("combine_with_xrlinear", "median")
    ),
    # (XR-Linear alone where the setting is not the neural methods': these rows run to the end today)
    setting("model_scale=medium", "method=xrlinear", "model_scale=medium", message=names("model_scale", "medium")),
    setting("cache=maybe", "method=xrlinear", "cache=maybe", message=names("cache", "maybe")),
    setting(
        "train_xrlinear=maybe", "method=xrlinear", "train_xrlinear=maybe", message=names("train_xrlinear", "maybe")
    ),
    setting("matcher.topb=0", "matcher.topb=0", message=names("topb", "0")),
    # the CNN baselines: the network's shape against the tokens read (train.yaml: 128)
    setting(
        "cnn filter wider than max_length",
        "method=kimcnn",
        "cnn.filter_widths=[200]",
        message=names("cnn.filter_widths", "[200]") + r".*wider than cnn\.max_length=128",
    ),
    setting("cnn.feature_maps=0", "method=xmlcnn", "cnn.feature_maps=0", message=names("cnn.feature_maps", "0")),
    setting(
        "cnn pooling chunks above the sequence",
        "method=xmlcnn",
        "cnn.pooling_chunks=200",
        message=names("cnn.pooling_chunks", "200") + r".*positions",
    ),
    setting("cnn.embeddings=glove", "method=kimcnn", "cnn.embeddings=glove", message=names("cnn.embeddings", "glove")),
    setting("matcher.embed_max_length=0", "matcher.embed_max_length=0", message=names("embed_max_length", "0")),
    setting("combine_weight=1.5", "combine_weight=1.5", message=names("combine_weight", "1.5")),
    setting("matcher.batch_size=0", "matcher.batch_size=0", message=names("batch_size", "0")),
    setting("matcher.lr=-1", "matcher.lr=-1", message=names("lr", "-1")),
    setting("ranker.Cp=-1", "ranker.Cp=-1", message=names("ranker.Cp", "-1")),
    setting(
        "xrlinear.model.beam_size=0",
        "method=xrlinear",
        "xrlinear.model.beam_size=0",
        message=names("xrlinear.model.beam_size", "0"),
    ),
    setting("tfidf.max_features=0", "tfidf.max_features=0", message=names("tfidf.max_features", "0")),
    # decisions: a threshold outside [0, 1], min_labels above max_labels, per-label thresholds with
    # no held-out documents to tune them on, more held-out documents than the training split has
    setting(
        "calibration.threshold=1.5",
        "calibration=platt",
        "calibration.threshold=1.5",
        message=names("calibration.threshold", "1.5"),
    ),
    setting(
        "calibration min_labels above max_labels",
        "calibration=platt",
        "calibration.min_labels=3",
        "calibration.max_labels=2",
        message=names("calibration.min_labels", "3") + r".*max_labels=2",
    ),
    setting(
        "per-label thresholds without held-out documents",
        "calibration.decision=per_label",
        message=names("calibration.decision", "per_label") + r".*held-out documents",
    ),
    setting(
        "calibration.holdout above the training split",
        "calibration=platt",
        f"calibration.holdout={N_TRAIN}",
        message=names("calibration.holdout", str(N_TRAIN)) + r".*the training split has",
    ),
    setting("missing encoder folder", "matcher.model_name_or_path=/no/such/model", message=r"^error: .*/no/such/model"),
    setting(
        "W&B last after a late error",
        "method=xrlinear",
        "logger=wandb",
        "xrlinear.model.negatives=foo",
        env={"WANDB_MODE": "offline"},
        message=names("xrlinear.model.negatives", "foo"),
    ),
    setting("data.max_docs=-5", "data.max_docs=-5", message=names("data.max_docs", "-5")),
    setting("data.max_docs=0", "data.max_docs=0", message=names("data.max_docs", "0")),
    setting("data.max_docs=abc", "data.max_docs=abc", message=names("data.max_docs", "abc")),
    setting("data.dev_fraction=1.5", "data.dev_fraction=1.5", message=names("data.dev_fraction", "1.5")),
    setting(
        "data.holdout above the training split",
        f"data.holdout={N_TRAIN}",
        "data.eval_split=holdout",
        message=names("data.holdout", str(N_TRAIN)) + r".*leaves no holdout or no train documents",
    ),
    setting("data.dev_fraction=abc", "data.dev_fraction=abc", message=names("data.dev_fraction", "abc")),
    setting(
        "data.eval_split=validation",
        "data.eval_split=validation",
        message=r"^error: data\.eval_split='validation' but the dataset has splits",
    ),
    setting(
        "data.format=parquet",
        "data.format=parquet",
        message=r"^error: data\.format must be auto, text, xc, npz or xmc-base, got 'parquet'",
    ),
    setting(
        "data=custom without data.path",
        drop=("data.path", "data.name"),
        message=r"^error: data\.path\b.*data\.path=",
        real_process=True,
    ),
    setting(
        "data.path a missing folder",
        "data.path=/no/such/folder",
        message=r"^error: unknown dataset 'small': no folder /no/such/folder.*data\.path",
    ),
]

DATA = [
    Case(
        "UTF-8 BOM in train_labels.txt",
        ("method=xrlinear",),
        code=0,
        check=same_as_reference,
        setup=edit("train_labels.txt", lambda b: b"\xef\xbb\xbf" + b),
    ),
    Case(
        "UTF-8 BOM in every file",
        ("method=xrlinear",),
        code=0,
        check=same_as_reference,
        setup=edit_all(lambda b: b"\xef\xbb\xbf" + b),
    ),
    Case(
        "CRLF line ends",
        ("method=xrlinear",),
        code=0,
        check=same_as_reference,
        setup=edit_all(lambda b: b.replace(b"\n", b"\r\n")),
    ),
    Case(
        "CR-only line ends",
        ("method=xrlinear",),
        code=0,
        check=same_as_reference,
        setup=edit_all(lambda b: b.replace(b"\n", b"\r")),
    ),
    Case(
        "comma-separated labels",
        setup=set_line("train_labels.txt", 3, "earn,acq"),
        message=r"^error: .*/train_labels\.txt:3: label id 'earn,acq' contains a comma.*'earn acq'",
    ),
    Case(
        "comma in a label_map id",
        setup=set_line("label_map.txt", 2, "acq,earn"),
        message=r"^error: .*/label_map\.txt:2: label id 'acq,earn' contains a comma",
    ),
    Case(
        "texts and labels misaligned",
        setup=edit("train_labels.txt", drop_last_line),
        message=rf"^error: .*/train_labels\.txt: train_texts\.txt has {N_TRAIN} lines but train_labels\.txt has "
        rf"{N_TRAIN - 1}",
    ),
    Case(
        "empty label line",
        setup=set_line("train_labels.txt", 5, ""),
        message=r"^error: .*/train_labels\.txt:5: empty label line .*data\.allow_empty_labels",
    ),
    Case(
        "empty document",
        setup=set_line("train_texts.txt", 7, "   "),
        message=r"^error: .*/train_texts\.txt:7: empty document .*data\.allow_empty_docs",
    ),
    Case(
        "undecodable bytes",
        setup=edit("train_texts.txt", lambda b: b.replace(b"\n", b"\n\xff\xfe", 1)),
        message=r"^error: .*/train_texts\.txt:2: undecodable bytes",
    ),
    Case(
        "label id not in label_map",
        setup=set_line("test_labels.txt", 4, "earn no_such_label"),
        message=r"^error: .*/test_labels\.txt:4: label id 'no_such_label' is not in the label map",
    ),
    Case(
        "duplicate label_map id",
        setup=set_line("label_map.txt", 3, "earn"),
        message=r"^error: .*/label_map\.txt: label vocabulary has duplicate id 'earn'",
    ),
    Case(
        "label_text line without a TAB",
        setup=set_line("label_text.txt", 2, "acq acquisitions"),
        message=r"^error: .*/label_text\.txt:2: expected 'id<TAB>name",
    ),
    Case(
        "ids file misaligned",
        setup=edit("train_ids.txt", drop_last_line),
        message=rf"^error: .*/train_ids\.txt: train_ids\.txt has {N_TRAIN - 1} lines, expected {N_TRAIN}",
    ),
    Case(
        "missing train_labels.txt",
        setup=delete("train_labels.txt"),
        message=r"^error: .*/train_labels\.txt: split 'train' is incomplete",
    ),
    Case(
        "missing test_texts.txt",
        setup=delete("test_texts.txt"),
        message=r"^error: .*/test_texts\.txt: split 'test' is incomplete",
    ),
    Case(
        "empty train files",
        setup=both(edit("train_texts.txt", lambda b: b""), edit("train_labels.txt", lambda b: b"")),
        message=r"^error: .*/train_texts\.txt: no documents: the file is empty",
    ),
    Case("no dataset files", setup=delete(), message=r"^error: .*: no dataset files found"),
    Case(
        "feature-only data with a neural method",
        setup=xc_files,
        message=r"^error: .*: method=xtransformer needs the documents' texts.*use method=xrlinear$",
    ),
    Case("feature-only data with method=xrlinear", ("method=xrlinear",), code=0, setup=xc_files),
    Case(
        "XC file with a bad header",
        ("method=xrlinear",),
        setup=both(xc_files, set_line("train.txt", 1, "sixty 20 20")),
        message=r"^error: .*/train\.txt:1: bad header 'sixty 20 20'",
    ),
    Case(
        "test labels never seen in training",
        ("method=xrlinear",),
        code=0,
        setup=unseen_test_labels,
        message=rf"WARNING\] 2 labels of the test split \({N_TEST} of its {N_TEST} documents; {N_TEST} have no other "
        r"label\) occur in no training document",
        check=unseen_reported,
    ),
    Case(
        "10 labels, default K = 16 (X-Transformer)",
        ("indexing.n_clusters=16",),
        code=0,
        setup=ten_labels,
        message=r"WARNING\] n_clusters=16 is more than the 10 labels: using 10 clusters",
    ),
    Case(
        "10 labels, default K = 16 (XR-Transformer)",
        ("method=xrtransformer", "indexing.n_clusters=16", "matcher.level_steps=[2,2]"),
        code=0,
        setup=ten_labels,
        message=r"WARNING\] n_clusters=16 is more than the 10 labels",
    ),
    Case(
        "indexing.n_clusters=100000",
        ("indexing.n_clusters=100000", "train_xrlinear=false"),
        code=0,
        message=r"WARNING\] n_clusters=100000 is more than the 90 labels: using 90 clusters",
    ),
]

# ------------------------------------------------------------------------------------------ cache and kills
# Each row's setup runs the job once (filling ctx.cache), keeps that run's metrics, then damages
# the cache or kills a run in a stage; the row's own run must warn, rebuild and end the same.
XRT = ("method=xrtransformer", "matcher.level_steps=[2,2]", "xrtransformer.eval_docs=20")


def _first_run(ctx: Ctx, overrides: tuple[str, ...]) -> None:
    res = ctx.run(*overrides)
    assert res.code == 0, res.tail()
    shutil.copy(ctx.run_dir / "metrics.json", ctx.work / "first_metrics.json")


def _stage_dir(ctx: Ctx, stage: str) -> Path:
    (folder,) = [p for p in (ctx.cache / "stages" / stage).iterdir() if not p.name.startswith((".", "_"))]
    return folder


def _largest_file(folder: Path, pattern: str = "*") -> Path:
    return max(
        (p for p in folder.rglob(pattern) if p.is_file() and not p.name.startswith("_")), key=lambda p: p.stat().st_size
    )


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other content
    path.write_bytes(bytes(raw))


def damaged(stage: str, how: str, *overrides: str, pattern: str = "*") -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        _first_run(ctx, overrides)
        target = _largest_file(_stage_dir(ctx, stage), pattern)
        if how == "flip":
            _flip(target)
        elif how == "truncate":
            target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
        else:  # delete
            target.unlink()

    return setup


def foreign_folder(ctx: Ctx) -> None:
    """The XR-Linear folder of other settings copied over this run's own: it must not be trusted."""
    _first_run(ctx, ("method=xrlinear", "xrlinear.model.Cp=4.0"))
    other = _stage_dir(ctx, "xrlinear")
    _first_run(ctx, ("method=xrlinear",))
    mine = next(p for p in (ctx.cache / "stages" / "xrlinear").iterdir() if p != other and not p.name.startswith("."))
    shutil.rmtree(mine)
    shutil.copytree(other, mine)


def killed_in(stage: str, *overrides: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        reference = Ctx(ctx.shared, ctx.data, ctx.work.parent / "reference_run")
        res = reference.run(*overrides)
        assert res.code == 0, res.tail()
        shutil.copy(reference.run_dir / "metrics.json", ctx.work.parent / "first_metrics.json")
        killed = ctx.run(*overrides, env={"XMC_KILL_IN_STAGE": stage})
        assert killed.code in (-9, 137), killed.tail()  # SIGKILL, as kill -9
        assert not (ctx.run_dir / "metrics.json").exists()

    return setup


def same_as_first(ctx: Ctx, res: Result) -> None:
    first = ctx.work / "first_metrics.json"
    first = first if first.is_file() else ctx.work.parent / "first_metrics.json"
    want = json.loads(first.read_text())
    assert ctx.metrics()["results"] == want["results"]


def nothing_cached(ctx: Ctx, res: Result) -> None:
    assert not ctx.cache.exists(), sorted(p.name for p in ctx.cache.iterdir())
    assert ctx.metrics()["results"] == ctx.shared.reference()["results"]


def poisoned_cache(ctx: Ctx) -> None:
    """A cache whose XR-Linear model is corrupt: cache=false must not even look at it."""
    _first_run(ctx, ("method=xrlinear",))
    _flip(_largest_file(_stage_dir(ctx, "xrlinear")))
    for p in ctx.work.glob("first_metrics.json"):
        p.unlink()


def copied_cache(ctx: Ctx) -> None:
    """The cache copied elsewhere with new file times: keys are content, so all of it is reused."""
    _first_run(ctx, ("method=xrlinear",))
    moved = ctx.work / "cache_original"
    ctx.cache.rename(moved)
    shutil.copytree(moved, ctx.cache, copy_function=shutil.copy)  # new mtimes
    for p in ctx.cache.rglob("*"):
        os.utime(p, (1, 1))


def reused_everything(ctx: Ctx, res: Result) -> None:
    same_as_first(ctx, res)
    assert ctx.metrics()["stages"]["ran"] == [], ctx.metrics()["stages"]


def stale_tmp(ctx: Ctx) -> None:
    """A temporary folder left by a killed writer (its pid no longer runs)."""
    _first_run(ctx, ("method=xrlinear",))
    (ctx.cache / "stages" / "xrlinear" / ".abc.pid999999.xyz.tmp").mkdir()


def stale_tmp_removed(ctx: Ctx, res: Result) -> None:
    same_as_first(ctx, res)
    assert not (ctx.cache / "stages" / "xrlinear" / ".abc.pid999999.xyz.tmp").exists()


def rebuilt(stage: str) -> str:
    return rf"WARNING\].*{stage}.*(corrupt|unreadable).*(rebuild|recomput|again)"


CACHE = [
    Case(
        "XR-Linear artifact flipped in place",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=damaged("xrlinear", "flip", "method=xrlinear"),
        message=rebuilt("xrlinear"),
        check=same_as_first,
    ),
    Case(
        "TF-IDF artifact truncated",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=damaged("tfidf", "truncate", "method=xrlinear"),
        message=rebuilt("tfidf"),
        check=same_as_first,
    ),
    Case(
        "TF-IDF artifact deleted",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=damaged("tfidf", "delete", "method=xrlinear"),
        message=rebuilt("tfidf"),
        check=same_as_first,
    ),
    Case(
        "index artifact flipped",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=damaged("indexing", "flip", "train_xrlinear=false"),
        message=rebuilt("indexing"),
        check=same_as_first,
    ),
    Case(
        "ranker artifact flipped",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=damaged("ranker", "flip", "train_xrlinear=false"),
        message=rebuilt("ranker"),
        check=same_as_first,
    ),
    Case(
        "matcher outputs flipped",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=damaged("matcher_outputs", "flip", "train_xrlinear=false", pattern="*.np[yz]"),
        message=r"WARNING\].*stage matcher_outputs: .*corrupt",
        check=same_as_first,
    ),
    Case(
        "matcher weights flipped",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=damaged("matcher", "flip", "train_xrlinear=false", pattern="*.safetensors"),
        message=r"WARNING\].*stage matcher: .*corrupt",
        check=same_as_first,
    ),
    Case(
        "foreign stage folder under this key",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=foreign_folder,
        message=r"WARNING\].*xrlinear.*foreign.*built for key",
        check=same_as_first,
    ),
    Case(
        "cache=false reads and writes nothing",
        ("method=xrlinear", "cache=false"),
        code=0,
        early=False,
        setup=poisoned_cache,
        check=lambda ctx, res: (ctx.metrics()["results"] == ctx.shared.reference()["results"])
        or pytest.fail("cache=false read the cache"),
    ),
    Case(
        "cache copied elsewhere (new paths, new file times)",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=copied_cache,
        check=reused_everything,
    ),
    Case(
        "temporary folder of a killed writer",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=stale_tmp,
        message=r"removed .*\.abc\.pid999999\.xyz\.tmp, left by a run that was killed",
        check=stale_tmp_removed,
    ),
    Case(
        "killed in the TF-IDF stage",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=killed_in("tfidf", "method=xrlinear"),
        check=same_as_first,
    ),
    Case(
        "killed in the XR-Linear stage",
        ("method=xrlinear",),
        code=0,
        early=False,
        setup=killed_in("xrlinear", "method=xrlinear"),
        check=same_as_first,
    ),
    Case(
        "killed in the indexing stage",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=killed_in("indexing", "train_xrlinear=false"),
        check=same_as_first,
    ),
    Case(
        "killed in the matcher stage",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=killed_in("matcher", "train_xrlinear=false"),
        check=same_as_first,
    ),
    Case(
        "killed in the ranker stage",
        ("train_xrlinear=false",),
        code=0,
        early=False,
        setup=killed_in("ranker", "train_xrlinear=false"),
        check=same_as_first,
    ),
    Case(
        "killed in an XR-Transformer level",
        (*XRT, "train_xrlinear=false"),
        code=0,
        early=False,
        setup=killed_in("xrlevel", *XRT, "train_xrlinear=false"),
        check=same_as_first,
    ),
    Case(
        "killed in XR-Transformer's final model",
        (*XRT, "train_xrlinear=false"),
        code=0,
        early=False,
        setup=killed_in("xrfinal", *XRT, "train_xrlinear=false"),
        check=same_as_first,
    ),
]


CASES = SETTINGS + DATA + CACHE


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.id, marks=marks)


def run_case(case: Case, shared: Shared, tmp_path: Path) -> tuple[Ctx, Result]:
    data = shared.small
    if case.setup is not None:  # a private copy to change
        data = tmp_path / "data"
        shutil.copytree(shared.small, data)
    ctx = Ctx(shared, data, tmp_path / "work")
    if case.setup is not None:
        case.setup(ctx)
    return ctx, ctx.run(*case.overrides, drop=case.drop, env=case.env, real_process=case.real_process)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case: Case, shared: Shared, tmp_path: Path) -> None:
    if case.skip_if and (why := case.skip_if()):
        pytest.skip(why)
    ctx, res = run_case(case, shared, tmp_path)
    assert res.code == case.code, res.tail()
    assert "Traceback (most recent call last)" not in res.stderr, res.tail()
    if case.code == 0:
        assert not case.message or re.search(case.message, res.stdout), res.tail()
    else:
        assert re.search(case.message, res.last_line), res.tail()
        if case.early:
            assert ctx.stages_written() == [], f"failed only after {ctx.stages_written()} were written"
    if case.check is not None:
        case.check(ctx, res)


def test_table_is_wide_enough() -> None:
    """Issue 15 asks for at least 40 bad inputs and faults; the ids name the rows in reports."""
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def test_tiny_model_reproducible_across_fresh_caches(shared: Shared, tmp_path: Path) -> None:
    """Two runs, two fresh caches, one seed: the same predictions. The tiny model's tokenizer is
    trained in each cache, and the `tokenizers` trainers number tokens in a per-process hash order
    (fixed in encoders/tiny.py; every family is checked in test_encoders.py): real processes, since
    children forked from one server could share that order."""
    from xtransformer.utils.io import load_csr

    preds = []
    for i in range(2):
        ctx = Ctx(shared, shared.small, tmp_path / f"run{i}")
        res = ctx.run("train_xrlinear=false", real_process=True)
        assert res.code == 0, res.tail()
        preds.append(load_csr(ctx.run_dir / "predictions" / "test.npz"))
    assert (preds[0] != preds[1]).nnz == 0
