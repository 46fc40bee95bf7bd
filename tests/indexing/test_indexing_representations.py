"""Label representations on a tiny hand-made problem (values checked by hand), orphans, errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.indexing import IndexingError, label_representation, parse_representation
from xtransformer.indexing.sparse_sums import label_sums

S2 = np.sqrt(2.0)

# 3 documents x 4 labels; label 3 has no positive document.
Y = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0]], dtype=np.float32))
X = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 0.6, 0.8], [0, 1.0, 0]], dtype=np.float32))  # unit rows
E = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32)  # document embeddings
TEXTS = ["apple", "banana", "cherry", "apples"]


def letter_counts(texts: list[str]) -> np.ndarray:
    """A fake encoder: bag of letters (mean-pooled 'token states' stand-in)."""
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out


def test_parse_names() -> None:
    assert parse_representation("pifa_concat") == ["pifa_tfidf", "pifa_neural"]
    assert parse_representation("pifa_tfidf+text_emb") == ["pifa_tfidf", "text_emb"]
    with pytest.raises(IndexingError, match="unknown label representation 'pifa'"):
        parse_representation("pifa")
    with pytest.raises(IndexingError, match="repeats"):
        parse_representation("text_emb+text_emb")


def test_pifa_tfidf_by_hand_with_row_normalised_y() -> None:
    F, rep = label_representation("pifa_tfidf", Y, X_tfidf=X, orphan_fallback="none")
    assert sp.isspmatrix_csr(F) and F.shape == (4, 3) and F.dtype == np.float32
    # doc weights 1/sqrt(2), 1, 1/sqrt(2): v0 = (x0 + x2)/sqrt2, v1 = x0/sqrt2 + x1, v2 = x2/sqrt2
    v1 = np.array([1 / S2, 0.6, 0.8]) / np.sqrt(1.5)
    expected = np.array([[1 / S2, 1 / S2, 0], v1, [0, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(F.toarray(), expected, atol=1e-6)
    assert rep["n_orphans"] == 1 and rep["orphan_fallback"] == "none" and rep["dims"] == {"pifa_tfidf": 3}


def test_pifa_tfidf_by_hand_without_row_normalisation() -> None:
    F, _ = label_representation("pifa_tfidf", Y, X_tfidf=X, normalize_y_rows=False, orphan_fallback="none")
    # v1 = x0 + x1 = [1, .6, .8] / sqrt(2): the single-label document now weighs as much as the other
    np.testing.assert_allclose(F.toarray()[1], np.array([1, 0.6, 0.8]) / S2, atol=1e-6)
    np.testing.assert_allclose(F.toarray()[0], [1 / S2, 1 / S2, 0], atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_label_sums_equal_scipys_product_to_the_bit(threads: int) -> None:
    """The compiled PIFA product gives scipy's csr: same sums, same column order, split over threads."""
    for seed in range(4):
        Y = sp.random(400, 300, density=0.02, format="csr", random_state=seed, dtype=np.float32)
        X = sp.random(400, 200, density=0.05, format="csr", random_state=seed + 10, dtype=np.float32)
        if seed == 3:
            Y = sp.csr_matrix((400, 300), dtype=np.float32)  # no positives at all
        expected, got = Y.T.tocsr() @ X, label_sums(Y.T.tocsr(), X, threads)
        assert got.dtype == np.float32 and got.shape == expected.shape
        for a, b in [(expected.indptr, got.indptr), (expected.indices, got.indices), (expected.data, got.data)]:
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="label_sums"):
        label_sums(Y.T.tocsr(), X[:10], threads)
    Y = sp.random(400, 300, density=0.02, format="csr", random_state=0, dtype=np.float32)
    assert label_representation("pifa_tfidf", Y, X_tfidf=X, orphan_fallback="none", threads=threads)[0].shape == (
        300,
        200,
    )


def test_pifa_neural_by_hand() -> None:
    F, _ = label_representation("pifa_neural", Y, doc_embeddings=E, orphan_fallback="none")
    assert isinstance(F, np.ndarray) and F.shape == (4, 2)
    expected = np.array([[2, 1] / np.sqrt(5), [1 / S2, 1] / np.sqrt(1.5), [1 / S2, 1 / S2], [0, 0]])
    np.testing.assert_allclose(F, expected, atol=1e-6)


def test_text_emb_falls_back_to_label_id() -> None:
    calls: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return letter_counts(texts)

    F, rep = label_representation(
        "text_emb", Y, label_texts=["apple", "", None, "date"], embed_fn=embed, label_ids=["a1", "bb", "cc", "d"]
    )
    assert calls == [["apple", "bb", "cc", "date"]]
    assert rep["n_text_missing"] == 2 and rep["n_orphans"] == 0
    np.testing.assert_allclose(np.linalg.norm(F, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(F[1], letter_counts(["bb"])[0] / 2.0, atol=1e-6)


def test_concat_blocks_are_equally_weighted() -> None:
    F, rep = label_representation("pifa_concat", Y, X_tfidf=X, doc_embeddings=E, orphan_fallback="none")
    tfidf, _ = label_representation("pifa_tfidf", Y, X_tfidf=X, orphan_fallback="none")
    neural, _ = label_representation("pifa_neural", Y, doc_embeddings=E, orphan_fallback="none")
    assert sp.isspmatrix_csr(F) and F.shape == (4, 5) and rep["dims"] == {"pifa_tfidf": 3, "pifa_neural": 2}
    np.testing.assert_allclose(F.toarray(), np.hstack([tfidf.toarray(), neural]) / S2, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(F.toarray()[:3], axis=1), 1.0, atol=1e-6)


def test_orphan_gets_text_neighbours_pifa() -> None:
    F, rep = label_representation("pifa_tfidf", Y, X_tfidf=X, label_texts=TEXTS, embed_fn=letter_counts)
    assert rep["orphan_fallback"] == "text_neighbour" and rep["n_orphans"] == 1
    np.testing.assert_allclose(F.toarray()[3], F.toarray()[0])  # "apples" borrows "apple"'s PIFA


def test_orphan_gets_random_label_without_texts() -> None:
    F, rep = label_representation("pifa_neural", Y, doc_embeddings=E, seed=3)
    assert rep["orphan_fallback"] == "random_label"
    assert any(np.allclose(F[3], F[i]) for i in range(3)) and np.linalg.norm(F[3]) > 0.99


def test_combination_with_text_block() -> None:
    F, rep = label_representation("pifa_tfidf+text_emb", Y, X_tfidf=X, label_texts=TEXTS, embed_fn=letter_counts)
    assert F.shape == (4, 3 + 26) and rep["n_orphans"] == 1
    np.testing.assert_allclose(np.sqrt(F.multiply(F).sum(axis=1)).A.ravel(), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("pifa_tfidf", {}, "`X_tfidf` is required"),
        ("pifa_tfidf", {"X_tfidf": X[:2]}, "2 documents|has shape"),
        ("pifa_tfidf", {"X_tfidf": X.toarray()}, "scipy sparse"),
        ("pifa_neural", {"doc_embeddings": sp.csr_matrix(E)}, "dense numpy"),
        ("pifa_neural", {"doc_embeddings": E * np.nan}, "NaN"),
        ("text_emb", {}, "`embed_fn` is required"),
        ("text_emb", {"embed_fn": lambda t: np.zeros((1, 3))}, "returned shape"),
        ("text_emb", {"embed_fn": letter_counts, "label_texts": ["a"]}, "`label_texts` has 1"),
        ("pifa_tfidf", {"X_tfidf": X, "orphan_fallback": "nearest"}, "orphan_fallback"),
        ("pifa_tfidf", {"X_tfidf": X, "orphan_fallback": "text_neighbour"}, "needs `embed_fn`"),
    ],
)
def test_errors(name: str, kwargs: dict, match: str) -> None:
    with pytest.raises(IndexingError, match=match):
        label_representation(name, Y, **kwargs)


def test_y_errors() -> None:
    with pytest.raises(IndexingError, match="scipy sparse"):
        label_representation("pifa_tfidf", Y.toarray(), X_tfidf=X)
    with pytest.raises(IndexingError, match="no positive label"):
        label_representation("pifa_tfidf", sp.csr_matrix((3, 4), dtype=np.float32), X_tfidf=X)
