"""Reproducible long-tailed synthetic XMC problems for scaling measurements.

The generator mimics what makes real XMC data hard and learnable at once:
  * label frequencies follow a power law (a few head labels, a long tail of rare ones);
  * each label owns a few "topic words", half shared with a latent label group (so that label
    clustering has structure to find) and half specific to it (so that labels are separable);
  * a document mixes draws from its labels' topic words with Zipf-distributed background words;
  * features are sublinear TF-IDF with l2-normalised rows, like ``tfidf_features``.
Everything is built with vectorised numpy/scipy; no dense ``N x L`` or ``N x F`` matrix exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp


class SyntheticError(ValueError):
    """A synthetic problem was asked for with impossible sizes."""


@dataclass(frozen=True)
class SyntheticSpec:
    n_train: int = 20_000
    n_test: int = 2_000
    n_labels: int = 5_000
    n_features: int = 50_000
    label_power: float = 1.1  # exponent of the label-frequency power law
    labels_per_doc: float = 3.0  # mean; at least one label per document
    n_groups: int = 0  # latent label groups; 0 means n_labels // 20
    words_per_label: int = 10  # topic words per label, half shared with its group
    label_draws: int = 6  # topic-word draws per (document, label) pair
    noise_words: int = 40  # background words per document
    seed: int = 0

    def validate(self) -> None:
        for name in ("n_train", "n_test", "n_labels", "n_features", "words_per_label", "label_draws"):
            if getattr(self, name) < 1:
                raise SyntheticError(f"synthetic {name} must be >= 1, got {getattr(self, name)}")
        if self.labels_per_doc < 1:
            raise SyntheticError(f"synthetic labels_per_doc must be >= 1, got {self.labels_per_doc}")
        if self.noise_words < 0 or self.n_groups < 0:
            raise SyntheticError("synthetic noise_words and n_groups must be >= 0")

    @property
    def tag(self) -> str:
        """Short folder-friendly name: sizes plus the seed."""
        return f"synthetic-n{self.n_train}-l{self.n_labels}-f{self.n_features}-seed{self.seed}"

    def as_dict(self) -> dict:
        return asdict(self)


def _power_law(n: int, power: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities ∝ rank^-power, randomly permuted so that id and frequency are unrelated."""
    p = np.arange(1, n + 1, dtype=np.float64) ** -power
    return rng.permutation(p / p.sum())


def _label_matrix(n_docs: int, label_p: np.ndarray, mean: float, rng: np.random.Generator) -> sp.csr_matrix:
    counts = 1 + rng.poisson(mean - 1.0, size=n_docs)
    rows = np.repeat(np.arange(n_docs), counts)
    cols = rng.choice(len(label_p), size=len(rows), p=label_p)
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_docs, len(label_p)))
    Y.sum_duplicates()
    Y.data[:] = 1.0  # a label drawn twice is still one positive
    return Y


def _label_words(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """``L x words_per_label`` feature ids: the first half from the label's group pool."""
    n_groups = spec.n_groups or max(1, spec.n_labels // 20)
    shared = spec.words_per_label // 2
    pool = max(shared, 2 * shared)
    group_pool = rng.integers(spec.n_features, size=(n_groups, pool))
    group = rng.integers(n_groups, size=spec.n_labels)
    from_group = group_pool[group[:, None], rng.integers(pool, size=(spec.n_labels, shared))]
    specific = rng.integers(spec.n_features, size=(spec.n_labels, spec.words_per_label - shared))
    return np.concatenate([from_group, specific], axis=1)


def _counts(
    Y: sp.csr_matrix, words: np.ndarray, noise_p: np.ndarray, spec: SyntheticSpec, rng: np.random.Generator
) -> sp.csr_matrix:
    """Term counts: topic-word draws for each (doc, label) pair plus background noise."""
    doc_of_pair = np.repeat(np.arange(Y.shape[0]), np.diff(Y.indptr))
    pair_rows = np.repeat(doc_of_pair, spec.label_draws)
    pair_labels = np.repeat(Y.indices, spec.label_draws)
    pair_cols = words[pair_labels, rng.integers(words.shape[1], size=len(pair_labels))]
    noise_rows = np.repeat(np.arange(Y.shape[0]), spec.noise_words)
    noise_cols = rng.choice(len(noise_p), size=len(noise_rows), p=noise_p)
    rows = np.concatenate([pair_rows, noise_rows])
    cols = np.concatenate([pair_cols, noise_cols])
    C = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(Y.shape[0], spec.n_features))
    C.sum_duplicates()
    return C


def _tfidf(C: sp.csr_matrix, idf: np.ndarray) -> sp.csr_matrix:
    X = C.copy()
    X.data = (1.0 + np.log(X.data)) * idf[X.indices]
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags((1.0 / np.maximum(norms, 1e-12)).astype(np.float32)) @ X
    X = sp.csr_matrix(X, dtype=np.float32)
    X.sort_indices()
    return X


def generate(spec: SyntheticSpec) -> dict[str, tuple[sp.csr_matrix, sp.csr_matrix]]:
    """Return ``{"train": (X, Y), "test": (X, Y)}``; identical for identical ``spec``."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    label_p = _power_law(spec.n_labels, spec.label_power, rng)
    noise_p = _power_law(spec.n_features, 1.0, rng)
    words = _label_words(spec, rng)
    Ys = {
        split: _label_matrix(n, label_p, spec.labels_per_doc, rng)
        for split, n in (("train", spec.n_train), ("test", spec.n_test))
    }
    Cs = {split: _counts(Y, words, noise_p, spec, rng) for split, Y in Ys.items()}
    df = np.bincount(Cs["train"].indices, minlength=spec.n_features)
    idf = (np.log((1.0 + spec.n_train) / (1.0 + df)) + 1.0).astype(np.float32)  # smooth idf
    return {split: (_tfidf(Cs[split], idf), Ys[split]) for split in Ys}
