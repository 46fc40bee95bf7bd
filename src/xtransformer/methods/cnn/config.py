"""The CNN baselines' settings: the ``cnn`` config group's record (Kim-CNN's published recipe its defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from xtransformer.errors import UserError
from xtransformer.settings import Settings, predict_field, run_field, train_field

EMBEDDINGS = ("encoder", "random")


class CNNConfigError(UserError):
    """A bad ``cnn.*`` setting (the message names the key)."""


@dataclass
class CNNConfig(Settings):
    """A text CNN over word embeddings: Kim-CNN (max pooling) or XML-CNN (dynamic max pooling of
    ``pooling_chunks`` values per feature map, then a ``bottleneck`` layer), binary cross-entropy
    over all labels. The defaults are Kim-CNN's recipe on EURLEX57K (LibMultiLabel's)."""

    where = "cnn"
    error = CNNConfigError

    name: str = run_field("kimcnn")  # display name of the config option (runs, W&B, tables)
    embeddings: str = "encoder"  # encoder: ``encoder``'s input-embedding table; random: N(0, 1) rows of embed_dim
    encoder: str = "minilm"  # the tokenizer (and, with embeddings: encoder, the word table) of this model
    embed_dim: int = 300  # width of random embeddings (an encoder's table has its own)
    max_length: int = 500  # tokens read per document (training and prediction)
    truncate_chars: int | None = None  # characters kept before tokenising; None: the whole text
    filter_widths: list[int] = field(default_factory=lambda: [8])  # one convolution per width
    feature_maps: int = 1024  # per filter width
    # values kept per feature map: 1 is max pooling over the sequence, more is XML-CNN's dynamic max pooling
    pooling_chunks: int = 1
    bottleneck: int = 0  # width of the layer between pooling and output (0: none)
    embed_dropout: float = 0.0  # on the word embeddings
    dropout: float = 0.4  # on the pooled features (and on the bottleneck's output)
    lr: float = 3e-4  # AdamW, linear decay to 0 over the run (in place of early stopping on dev)
    weight_decay: float = 0.0  # not applied to biases nor to the word embeddings
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.0
    batch_size: int = 16
    max_steps: int = -1  # optimizer steps; -1: train by max_epochs
    max_epochs: int | None = 50
    grad_clip: float | None = None  # gradient norm clipping; None: off
    accumulate_grad_batches: int = 1
    seed: int = train_field(0, hydra="${seed}")  # the run's seed
    topk: int = predict_field(20)  # labels kept per document
    inference_precision: str | None = predict_field(None)  # prediction autocast; None: the trainer's precision
    eval_batch_size: int = run_field(64)
    checkpoint_every_n_steps: int = run_field(500)  # a killed run resumes from the last of these
    keep_checkpoints: bool = run_field(True)
    # dev scores while training (reported, never chosen on); None: at the end of each epoch
    val_every_n_steps: int | None = run_field(None)
    limit_val_batches: float = run_field(1.0)
    num_workers: int = run_field(0)
    cache_dir: str | None = run_field(None)  # token cache; None: the run's cache
    progress: bool = run_field(True)

    def check(self) -> None:
        if self.embeddings not in EMBEDDINGS:
            raise self.bad("embeddings", f"expected one of {list(EMBEDDINGS)}")
        for key in (
            "embed_dim",
            "max_length",
            "feature_maps",
            "pooling_chunks",
            "batch_size",
            "topk",
            "eval_batch_size",
            "accumulate_grad_batches",
            "checkpoint_every_n_steps",
        ):
            if getattr(self, key) < 1:
                raise self.bad(key, "must be an int >= 1")
        if not self.filter_widths or min(self.filter_widths) < 1:
            raise self.bad("filter_widths", "must be a non-empty list of ints >= 1")
        if max(self.filter_widths) > self.max_length:
            raise self.bad("filter_widths", f"has a filter wider than cnn.max_length={self.max_length} tokens")
        if self.pooling_chunks > self.max_length - max(self.filter_widths) + 1:
            raise self.bad(
                "pooling_chunks",
                f"is more than the {self.max_length - max(self.filter_widths) + 1} "
                "positions the widest filter leaves of cnn.max_length tokens",
            )
        if self.bottleneck < 0:
            raise self.bad("bottleneck", "must be an int >= 0 (0: no bottleneck)")
        for key in ("embed_dropout", "dropout", "warmup_ratio"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise self.bad(key, "must be in [0, 1)")
        if not self.lr > 0 or self.weight_decay < 0:
            raise self.bad("lr" if not self.lr > 0 else "weight_decay", "must be > 0 (lr) / >= 0 (weight_decay)")
        if self.max_steps == 0 or self.max_steps < -1:
            raise self.bad("max_steps", "must be >= 1, or -1 to train by max_epochs")
        if self.max_steps == -1 and not self.max_epochs:
            raise self.bad("max_epochs", "must be set when cnn.max_steps=-1")

    @property
    def embed_length(self) -> int:
        """Tokens read per document at prediction: the training length."""
        return self.max_length


def xmlcnn_recipe() -> CNNConfig:
    """XML-CNN (Liu et al., SIGIR 2017) on EUR-Lex, LibMultiLabel's recipe: filters of widths 2 / 4 / 8,
    256 maps each, dynamic max pooling (2 pooled values per map), a 512-wide bottleneck before the
    output, dropout 0.2 (and on the word embeddings), Adam at 5e-4, batches of 64; every other field
    as Kim-CNN's. ``XMLCNN``'s default and the config option ``cnn=xmlcnn`` (``configuration.RECIPES``)."""
    return CNNConfig(
        name="xmlcnn",
        filter_widths=[2, 4, 8],
        feature_maps=256,
        pooling_chunks=2,
        bottleneck=512,
        embed_dropout=0.2,
        dropout=0.2,
        lr=5e-4,
        batch_size=64,
    )


@dataclass
class KimCNNSettings(Settings):
    """Everything ``KimCNN.fit`` reads."""

    cnn: CNNConfig = field(default_factory=CNNConfig)


@dataclass
class XMLCNNSettings(Settings):
    """Everything ``XMLCNN.fit`` reads."""

    cnn: CNNConfig = field(default_factory=xmlcnn_recipe)
