"""Matcher settings: the ``matcher`` config group's record (its defaults are the group's base node)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xtransformer.encoders import POOLINGS
from xtransformer.errors import UserError
from xtransformer.settings import Settings, predict_field, run_field, train_field

EMBEDDING_DTYPES = ("float32", "float16")
# transformer: the encoder below, fine-tuned; cnn: X-Transformer's matcher is the `cnn` group's text CNN
ARCHITECTURES = ("transformer", "cnn")
# what a CNN matcher still reads of this group at training: the choice, and the pretrained encoder
# a label tree may embed with (indexing=text_emb / pifa_neural); the CNN trains by the `cnn` group's recipe
_CNN_READS = frozenset({"architecture", "model_name_or_path", "max_length", "truncate_chars"})

# XR-Transformer's per-level schedule: training settings of the level loop, not of the one-level matcher
_LEVEL_SCHEDULE = frozenset({"level_steps", "level_lr", "level_warmup_ratio"})


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class MatcherConfigError(UserError):
    """A matcher setting with a bad value (the message names the ``matcher.*`` key)."""


@dataclass
class MatcherConfig(Settings):
    """Fine-tuning of the neural matcher (encoder + K-way linear head, squared hinge loss)."""

    where = "matcher"
    error = MatcherConfigError

    name: str = run_field("custom")  # display name of the config option (runs, W&B, tables); not a setting
    # transformer: the encoder below, fine-tuned | cnn: the `cnn` group's text CNN (X-Transformer only:
    # matcher=kimcnn, xmlcnn)
    architecture: str = "transformer"
    # an alias (minilm, mpnet), a local folder (config.json), tiny:<bert|roberta|xlnet>, or a Hugging Face
    # id in the local cache
    model_name_or_path: str = "minilm"
    pooling: str = "auto"  # auto | cls | last | mean; auto: XLNet last, BERT/RoBERTa cls, sentence-transformers mean
    max_length: int = 128  # tokens per document while fine-tuning (the paper's T = 128)
    truncate_chars: int | None = None  # characters kept before tokenising; None: the whole text
    # tokens per document when the fine-tuned encoder embeds (the ranker's features, the top-b
    # shortlist, prediction); null: max_length. Reading more of each document than fine-tuning did
    # costs only inference time (experiment=eurlex57k_xr_ensemble reads 256 after fine-tuning on 128)
    embed_max_length: int | None = predict_field(None)
    batch_size: int = 32  # per device
    eval_batch_size: int = run_field(128)
    lr: float = 5e-5  # the encoder's
    head_lr: float | None = None  # the Linear(H, K) head's; None: same as lr
    weight_decay: float = 0.01  # not applied to biases / LayerNorm
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.1  # linear warmup, then linear decay to 0
    max_steps: int = 300  # optimizer steps; -1: train by max_epochs
    max_epochs: int | None = None
    grad_clip: float | None = 1.0  # gradient norm clipping; None: off
    # every dropout of the encoder (hidden and attention) while fine-tuning; null: the model's own
    # (0.1 for BERT / MiniLM / MPNet). On a CPU, attention dropout keeps SDPA off its fused kernel
    # and draws a random number per attention weight (experiments/dropout).
    dropout: float | None = None
    accumulate_grad_batches: int = 1
    val_every_n_steps: int | None = run_field(None)  # None: validate at the end of each epoch
    limit_val_batches: float = run_field(1.0)
    topb: int = predict_field(20)  # clusters kept per document (the shortlist, matcher-aware negatives)
    save_embeddings_dtype: str = predict_field("float32")  # float32 | float16
    normalize_embeddings: bool = predict_field(False)  # l2-normalise the saved embeddings
    inference_precision: str | None = predict_field(None)  # None: the trainer's precision
    checkpoint_every_n_steps: int = run_field(50)
    keep_checkpoints: bool = run_field(True)
    num_workers: int = run_field(0)
    # tokens and assembled models (in no cache key); None: the project cache ($XMC_CACHE_DIR or ./cache),
    # in a run paths.cache_dir
    cache_dir: str | None = run_field(None, hydra="${paths.cache_dir}")
    progress: bool = run_field(True)
    seed: int = train_field(0, hydra="${seed}")  # the run's seed
    # XR-Transformer's per-level schedule (coarse to fine; ignored by the single-level matcher).
    # level_steps: optimizer steps per fine-tuned level, e.g. [200, 300, 500]; null: max_steps split
    # 1 : 2 : ... : T. level_lr / level_warmup_ratio: per level; null: lr / warmup_ratio at every level.
    level_steps: list[int] | None = None
    level_lr: list[float] | None = None
    level_warmup_ratio: list[float] | None = None

    def check(self) -> None:
        bad = self.bad

        if self.architecture not in ARCHITECTURES:
            raise bad("architecture", f"expected one of {list(ARCHITECTURES)}")
        if not str(self.model_name_or_path).strip():
            raise bad("model_name_or_path", "must name a model or a local folder")
        if self.pooling not in ("auto",) + POOLINGS:
            raise bad("pooling", f"expected one of {['auto', *POOLINGS]}")
        for key in (
            "max_length",
            "batch_size",
            "eval_batch_size",
            "topb",
            "accumulate_grad_batches",
            "checkpoint_every_n_steps",
        ):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        if self.embed_max_length is not None and self.embed_max_length < 1:
            raise bad("embed_max_length", "must be >= 1 or null (null: max_length)")
        if self.truncate_chars is not None and self.truncate_chars < 1:
            raise bad("truncate_chars", "must be >= 1 or null")
        if self.lr <= 0 or (self.head_lr is not None and self.head_lr <= 0):
            raise bad("lr" if self.lr <= 0 else "head_lr", "must be > 0")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio", "must be in [0, 1)")
        if self.dropout is not None and not (_is_number(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise bad("dropout", "must be in [0, 1) or null (null: the model's own rates)")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        if self.max_steps == 0 or self.max_steps < -1:
            raise bad("max_steps", "must be >= 1, or -1 to train by max_epochs")
        if self.max_steps == -1 and not self.max_epochs:
            raise bad("max_epochs", "must be set when matcher.max_steps=-1")
        if self.save_embeddings_dtype not in EMBEDDING_DTYPES:
            raise bad("save_embeddings_dtype", f"expected one of {list(EMBEDDING_DTYPES)}")
        if self.val_every_n_steps is not None and self.val_every_n_steps < 1:
            raise bad("val_every_n_steps", "must be >= 1 or null")
        rules = {
            "level_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
            "level_lr": (lambda v: _is_number(v) and v > 0, "a number > 0"),
            "level_warmup_ratio": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        }
        for key, (ok, what) in rules.items():
            values = getattr(self, key)
            if values is None:
                continue
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0:
                raise bad(key, "must be a non-empty list (one entry per fine-tuned level) or null")
            if not all(ok(v) for v in values):
                raise bad(key, f"every entry must be {what}")

    @property
    def embed_length(self) -> int:
        """Tokens per document when embedding (``embed_max_length``, or ``max_length``)."""
        return int(self.embed_max_length or self.max_length)

    def level_schedule(self, n_levels: int) -> list[dict[str, float | int]]:
        """Steps, learning rate and warmup ratio of each of ``n_levels`` fine-tuned levels.

        An explicit list must name every level (a shorter or longer one is an error, never padded);
        without one, ``max_steps`` is split 1 : 2 : ... : T so that finer levels, which have more
        clusters to tell apart, get more steps (PECOS's Eurlex-4K recipe: 600 / 800 / 1,200).
        """

        def pick(key: str, default: float) -> list:
            values = getattr(self, key)
            if values is None:
                return [default] * n_levels
            if len(values) != n_levels:
                raise MatcherConfigError(
                    f"matcher.{key}={list(values)!r}: has {len(values)} entries but "
                    f"{n_levels} levels are fine-tuned (one entry per level)"
                )
            return list(values)

        if self.level_steps is None:
            if self.max_steps < 1:
                raise MatcherConfigError("matcher.level_steps: set it (one entry per level) when matcher.max_steps=-1")
            total = n_levels * (n_levels + 1) // 2
            steps = [max(1, round(self.max_steps * (t + 1) / total)) for t in range(n_levels)]
        else:
            steps = pick("level_steps", 0)
        return [
            {"steps": int(s), "lr": float(lr), "warmup_ratio": float(w)}
            for s, lr, w in zip(steps, pick("level_lr", self.lr), pick("level_warmup_ratio", self.warmup_ratio))
        ]

    def training_settings(self, levels: bool = False) -> dict[str, Any]:
        """The fields that determine the fine-tuned weights (the checkpoint / model cache key).

        ``levels``: include XR-Transformer's per-level schedule (it does not touch the single-level
        matcher, so its key leaves it out). A CNN matcher keeps only what it reads (``_CNN_READS``).
        """
        out = super().training_settings()
        if self.architecture == "cnn":
            return {k: v for k, v in out.items() if k in _CNN_READS}
        return out if levels else {k: v for k, v in out.items() if k not in _LEVEL_SCHEDULE}

    def key_settings(self, levels: bool = False) -> dict[str, Any]:
        """:meth:`training_settings` as stage keys read them: a transformer matcher's without
        ``architecture``, so its stages keep the keys they had before the choice existed."""
        out = self.training_settings(levels)
        return {k: v for k, v in out.items() if k != "architecture"} if self.architecture == "transformer" else out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MatcherConfig:
        return cls.from_mapping(values)
