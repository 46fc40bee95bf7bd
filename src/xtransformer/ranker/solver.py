"""Solvers for many independent L2-regularised binary linear problems, a block at a time.

A *block* stacks ``T`` tasks (clusters) block-diagonally: task ``t`` owns a set of rows (its
training instances) and a set of columns (the features that occur in those rows, plus the bias
column), and ``n`` label slots. A block is a view of the training matrix (its rows and
columns); only the Newton solver materialises the block matrix. Problem ``(t, j)`` is the binary
classifier of the ``j``-th label of task ``t``; a slot whose targets are 0 is padding (its
solution stays 0). For the Newton solver every problem of the block shares one sparse matrix,
and every step is one sparse-times-dense product (``X @ V`` or ``X^T @ U`` with ``V`` of shape
``F_block x n``) plus elementwise work, whatever the number of tasks: no Python loop over labels
or clusters.

Objective of each problem (LIBLINEAR's primal, bias regularised like LIBLINEAR/PECOS)::

    f(w) = 1/2 ||w||^2 + sum_i c_i loss(y_i w.x_i)

with ``loss(m) = max(0, 1 - m)^2`` (squared hinge) or ``log(1 + exp(-m))`` (logistic) and
``c_i = Cp`` for positives, ``Cn`` for negatives. The squared hinge is solved as PECOS does, by
LIBLINEAR's dual coordinate descent (a compiled loop over a task's slots at once,
``kernels.py``): about as many passes over the rows as it needs, where Newton-CG makes two
sparse products per CG step.
The logistic loss uses LIBLINEAR's (>= 2.40) Newton with
a line search: diagonally preconditioned CG (preconditioner ``(1 - a) + a diag(H)``, ``a = 0.01``;
stop on the quadratic-model decrease rule with ``eps_cg = 0.5``), then a backtracking Armijo line
search (``eta = 0.01``) that costs no extra sparse product because ``X (w + alpha s) = Xw + alpha Xs``.
All per-problem scalars are ``T x n`` tensors obtained by segment sums over the block's sorted
rows/columns. A problem stops when ``||grad|| <= eps * ||grad at w = 0||`` or after ``max_iter``
Newton iterations; finished problems are frozen (their step is 0) while the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.blocks import BlockData
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.kernels import dual_cd_squared_hinge, gather_block

PRECOND_MIX = 0.01  # LIBLINEAR's mixing weight of diag(H) in the preconditioner
EPS_CG = 0.5  # LIBLINEAR's relative tolerance of the quadratic-model CG stopping rule
ARMIJO_ETA = 0.01
MAX_LINE_SEARCH = 20
COMPACT_AT = 0.75  # drop finished label slots once at most this fraction is live


@dataclass(frozen=True)
class SolverParams:
    loss: str = "squared_hinge"
    Cp: float = 1.0
    Cn: float = 1.0
    eps: float = 0.1
    max_iter: int = 100
    max_cg_iter: int = 20
    seed: int = 0  # order of the dual coordinate descent's passes


@dataclass
class SolveStats:
    cd_passes: int = 0
    newton_iters: int = 0
    cg_iters: int = 0
    spmm: int = 0
    problems: int = 0
    converged: int = 0

    def add(self, other: SolveStats) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass(eq=False)
class Block:
    """``T`` tasks stacked block-diagonally; rows and columns sorted by task.

    The block is a view: task rows are ``rows`` of ``source`` (csr, ``n_features`` columns) plus a
    constant ``bias`` feature (column id ``n_features`` in ``col_feature``, when ``bias > 0``), and
    task ``t``'s columns are its slice of ``col_feature``. The dual coordinate descent reads a big
    task's rows in place and copies a small one's while it runs (``kernels._gather_rows``); the
    Newton solver needs the block matrix itself (``X``, csr float32, built once
    per block by :meth:`from_rows` with ``materialise``). Its sparse products release the GIL, so
    the worker threads of ``fit.BlockTrainer`` run them in parallel; ``X^T @ U`` goes through the
    transposed view (as fast here as a transposed copy, which would double the block's memory).
    """

    source: sp.csr_matrix
    n_features: int
    rows: np.ndarray  # R, rows of source
    col_feature: np.ndarray  # Fb, columns of source (n_features = the bias)
    bias: float
    Y: np.ndarray  # R x n int8: +1 / -1, 0 in a padding slot
    Cp: float  # cost of a positive row
    Cn: float  # cost of a negative row
    row_len: np.ndarray  # T, rows per task
    col_len: np.ndarray  # T, columns per task
    row_cost: np.ndarray | None = None  # R, each row's cost multiplier (float64); None: all 1
    stats: SolveStats = field(default_factory=SolveStats)
    X: sp.csr_matrix | None = field(default=None, repr=False)  # the block matrix, R x Fb
    _X_sq: sp.csr_matrix | None = field(default=None, repr=False)
    _cost: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_rows(
        cls, source: sp.csr_matrix, layout: BlockData, bias: float, Cp: float, Cn: float, materialise: bool = False
    ) -> Block:
        """The block whose rows, columns per task and targets ``layout`` names, over ``source``."""
        rows, row_len, col_len, col_feature, Y = (
            layout.rows,
            layout.row_len,
            layout.col_len,
            layout.col_feature,
            layout.Y,
        )
        if len(rows) != int(row_len.sum()) or len(col_feature) != int(col_len.sum()) or Y.shape[0] != len(rows):
            raise RankerError(
                f"solver block: inconsistent shapes rows {len(rows)} / {int(row_len.sum())}, "
                f"cols {len(col_feature)} / {int(col_len.sum())}, Y {Y.shape}"
            )
        block = cls(
            source=source,
            n_features=source.shape[1],
            rows=np.asarray(rows, np.int64),
            col_feature=np.asarray(col_feature, np.int64),
            bias=float(bias),
            Y=np.ascontiguousarray(Y if Y.dtype == np.int8 else np.sign(Y), dtype=np.int8),
            Cp=float(Cp),
            Cn=float(Cn),
            row_len=np.asarray(row_len, dtype=np.int64),
            col_len=np.asarray(col_len, dtype=np.int64),
            row_cost=None if layout.row_cost is None else np.ascontiguousarray(layout.row_cost, np.float64),
        )
        if materialise:
            indptr, indices, data = gather_block(
                source.indptr,
                source.indices,
                source.data,
                block.n_features,
                block.rows,
                block.row_len,
                block.col_feature,
                block.col_len,
                np.float32(block.bias),
            )
            block.X = sp.csr_matrix((data, indices, indptr), shape=(len(rows), len(col_feature)))
            block.X.has_sorted_indices = source.has_sorted_indices  # columns keep the source's order
        return block

    @classmethod
    def from_scipy(
        cls,
        Xb: sp.csr_matrix,
        row_len: np.ndarray,
        col_len: np.ndarray,
        Y: np.ndarray,
        Cp: float = 1.0,
        Cn: float = 1.0,
    ) -> Block:
        """A block from its matrix (``R x Fb``, bias column included): its own source."""
        if Xb.shape != (int(row_len.sum()), int(col_len.sum())):
            raise RankerError(
                f"solver block: X {Xb.shape} does not match rows {int(row_len.sum())}, cols {int(col_len.sum())}"
            )
        Xb = _f32_csr(Xb)
        layout = BlockData(
            np.arange(Xb.shape[0]), row_len, col_len, np.arange(Xb.shape[1]), np.zeros((len(row_len), 0), np.int64), Y
        )
        block = cls.from_rows(Xb, layout, 0.0, Cp, Cn)
        block.X = Xb
        return block

    def columns(self, cols: slice | np.ndarray, share_stats: bool = False) -> Block:
        """The same tasks and matrices restricted to label slots ``cols``."""
        return replace(
            self,
            Y=np.ascontiguousarray(self.Y[:, cols]),
            _cost=None,
            stats=self.stats if share_stats else SolveStats(),
        )

    @property
    def cost(self) -> np.ndarray:
        """``R x n`` float32 cost of each row in each problem (0 in padding slots), built on first
        use: only the Newton solver needs it as an array."""
        if self._cost is None:
            self._cost = np.where(self.Y > 0, np.float32(self.Cp), np.float32(self.Cn)).astype(np.float32)
            self._cost *= self.Y != 0
            if self.row_cost is not None:
                self._cost *= self.row_cost.astype(np.float32)[:, None]
        return self._cost

    @property
    def n_tasks(self) -> int:
        return len(self.row_len)

    # per-problem reductions (T x n) and their broadcasts back to rows / columns
    def row_sum(self, A: np.ndarray) -> np.ndarray:
        return _segment_sum(A, self.row_len)

    def col_dot(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Per-problem dot products of two ``Fb x n`` arrays (``T x n``)."""
        if len(self.col_len) == 1:
            return np.einsum("ij,ij->j", A, B)[None, :]
        return _segment_sum(A * B, self.col_len)

    def to_rows(self, v: np.ndarray) -> np.ndarray:
        return _expand(v, self.row_len)

    def to_cols(self, v: np.ndarray) -> np.ndarray:
        return _expand(v, self.col_len)

    def mv(self, V: np.ndarray) -> np.ndarray:
        self.stats.spmm += 1
        return self.X @ V

    def tmv(self, U: np.ndarray, squared: bool = False) -> np.ndarray:
        """``X^T @ U``, or ``(X * X)^T @ U`` (for diag(H)), the squares kept once per block."""
        self.stats.spmm += 1
        if not squared:
            return self.X.T @ U
        if self._X_sq is None:
            self._X_sq = sp.csr_matrix((np.square(self.X.data), self.X.indices, self.X.indptr), shape=self.X.shape)
        return self._X_sq.T @ U


def _f32_csr(M: sp.csr_matrix) -> sp.csr_matrix:
    # int32 indices and float32 values: the narrowest types scipy's kernels take (half the traffic)
    idx = np.int32 if M.nnz < 2**31 - 1 and max(M.shape) < 2**31 - 1 else np.int64
    return sp.csr_matrix(
        (np.asarray(M.data, dtype=np.float32), M.indices.astype(idx, copy=False), M.indptr.astype(idx, copy=False)),
        shape=M.shape,
    )


def _segment_sum(A: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    if len(lengths) == 1:
        return A.sum(0, keepdims=True)
    starts = np.cumsum(lengths) - lengths
    out = (
        np.add.reduceat(A, np.minimum(starts, max(len(A) - 1, 0)), axis=0)
        if len(A)
        else np.zeros((len(lengths),) + A.shape[1:], A.dtype)
    )
    out[lengths == 0] = 0  # reduceat gives the next element for an empty segment
    return out


def _expand(v: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    if len(lengths) == 1:
        return v  # broadcasts
    return np.repeat(v, lengths, axis=0)


# ---------------------------------------------------------------------------------------------- loss
@dataclass
class _LossState:
    value: np.ndarray  # T x n, loss part of the objective
    dz: np.ndarray  # R x n, d loss / d z
    curv: np.ndarray  # R x n, d^2 loss / d z^2 (generalised for the squared hinge)

    def take(self, keep: np.ndarray) -> _LossState:
        return _LossState(self.value[:, keep], self.dz[:, keep], self.curv[:, keep])


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0.0), v)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * v))  # tanh form: no overflow


def _hinge_margin(block: Block, Z: np.ndarray) -> np.ndarray:
    m = block.Y * Z
    np.subtract(np.float32(1.0), m, out=m)
    return np.maximum(m, np.float32(0.0), out=m)


def _loss_values(block: Block, Z: np.ndarray, loss: str) -> np.ndarray:
    if loss == "squared_hinge":
        m = _hinge_margin(block, Z)
        m *= m
        m *= block.cost
        return block.row_sum(m)
    return block.row_sum(block.cost * _softplus(-block.Y * Z))


def _loss_state(block: Block, Z: np.ndarray, loss: str) -> _LossState:
    if loss == "squared_hinge":
        m = _hinge_margin(block, Z)
        cm = block.cost * m
        curv = (m > 0).astype(np.float32)
        curv *= block.cost
        curv *= np.float32(2.0)
        dz = cm * block.Y
        dz *= np.float32(-2.0)
        return _LossState(value=block.row_sum(cm * m), dz=dz, curv=curv)
    if loss == "logistic":
        yz = block.Y * Z
        sg = _sigmoid(-yz)
        return _LossState(
            value=block.row_sum(block.cost * _softplus(-yz)),
            dz=-block.cost * block.Y * sg,
            curv=block.cost * sg * (1.0 - sg),
        )
    raise RankerError(f"solver: loss must be 'squared_hinge' or 'logistic', got {loss!r}")


# ---------------------------------------------------------------------------------------------- solvers
@dataclass
class SolvedWeights:
    """The kept weights of a block: ``val[i]`` at block column ``col[i]`` of label slot ``slot[i]``.
    Each slot's weights come as one run with increasing columns."""

    col: np.ndarray  # int32 or int64
    slot: np.ndarray  # int32 or int64
    val: np.ndarray  # float32


def solve_block(block: Block, params: SolverParams, threshold: float = 0.0) -> SolvedWeights:
    """Solve every problem of ``block``; return its weights with ``|w| >= threshold`` (padding
    slots left out).

    Squared hinge: PECOS's / LIBLINEAR's dual coordinate descent (``kernels.dual_cd_squared_hinge``;
    ``eps`` bounds the projected-gradient spread, ``max_iter`` the passes), which hands back only
    the kept weights. Logistic: the batched primal Newton-CG below (``eps`` relative gradient
    norm, ``max_iter`` Newton iterations), on dense ``Fb x n`` weights.
    """
    if params.loss == "squared_hinge":
        return _solve_dual_cd(block, params, threshold)
    if params.loss == "logistic":
        Wt = _solve_newton(block, params).T  # slot-major: each slot's weights come out as one run
        slot, col = np.nonzero(np.abs(Wt) >= threshold)
        real = _is_problem(block)[np.repeat(np.arange(block.n_tasks), block.col_len)[col], slot]
        return SolvedWeights(col[real], slot[real], Wt[slot[real], col[real]])
    raise RankerError(f"solver: loss must be 'squared_hinge' or 'logistic', got {params.loss!r}")


def _solve_dual_cd(block: Block, params: SolverParams, threshold: float) -> SolvedWeights:
    S, n = block.source, block.Y.shape[1]
    passes = np.zeros((block.n_tasks, n), dtype=np.int64)
    col, slot, val = dual_cd_squared_hinge(
        S.indptr,
        S.indices,
        S.data,
        block.n_features,
        block.rows,
        block.row_len,
        block.col_feature,
        block.col_len,
        np.float32(block.bias),
        block.Y,
        float(block.Cp),
        float(block.Cn),
        block.row_cost if block.row_cost is not None else np.zeros(0, np.float64),
        float(params.eps),
        int(params.max_iter),
        int(params.seed),
        float(threshold),
        passes,
    )
    is_problem = _is_problem(block)
    block.stats.problems += int(is_problem.sum())
    block.stats.converged += int((is_problem & (passes < params.max_iter)).sum())
    block.stats.cd_passes += int(passes.sum())
    return SolvedWeights(col, slot, val)


def _is_problem(block: Block) -> np.ndarray:
    """``T x n``: which (task, slot) pairs are problems (a padding slot's targets are 0)."""
    if block.Y.shape[0] == 0:
        return np.zeros((block.n_tasks, block.Y.shape[1]), bool)
    return block.Y[np.cumsum(block.row_len) - block.row_len] != 0


def _solve_newton(block: Block, params: SolverParams) -> np.ndarray:
    """Solve every problem of ``block``; return the weights ``Fb x n`` (float32).

    Label slots whose problems have all stopped are dropped from the arrays (once at most
    ``COMPACT_AT`` of them are still live), so the few slow problems do not drag the others'
    columns through every sparse product.
    """
    n = block.Y.shape[1]
    W_out = np.zeros((block.X.shape[1], n), dtype=np.float32)
    cols = np.arange(n)
    W = W_out.copy()
    Z = np.zeros((block.Y.shape[0], n), dtype=np.float32)
    is_problem = block.row_sum(block.cost) > 0  # T x n: padding slots are no problem
    st = _loss_state(block, Z, params.loss)
    G = block.tmv(st.dz)  # gradient at w = 0 (the regulariser's gradient is 0 there)
    gnorm0 = np.sqrt(block.col_dot(G, G))
    tol = np.float32(params.eps) * gnorm0
    active = is_problem & (gnorm0 > 0)
    block.stats.problems += int(is_problem.sum())
    block.stats.converged += int((is_problem & ~active).sum())
    fval = st.value
    wTw = np.zeros_like(fval)
    for _ in range(params.max_iter):
        live = active.any(0)
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live <= COMPACT_AT * len(cols):
            W_out[:, cols] = W
            keep = np.flatnonzero(live)
            cols = cols[keep]
            block = block.columns(keep, share_stats=True)
            W, Z, G = W[:, keep], Z[:, keep], G[:, keep]
            st = st.take(keep)
            fval, wTw, tol, active = fval[:, keep], wTw[:, keep], tol[:, keep], active[:, keep]
        block.stats.newton_iters += 1
        S = _pcg(block, G, st.curv, active, params.max_cg_iter)
        XS = block.mv(S)
        alpha, fnew = _line_search(block, _Point(W, Z, G, fval, wTw), S, XS, active, params.loss)
        moved = alpha > 0
        active &= moved  # a failed line search ends that problem, as in LIBLINEAR
        W += block.to_cols(alpha) * S
        Z += block.to_rows(alpha) * XS
        fval = np.where(moved, fnew, fval)
        wTw = block.col_dot(W, W)
        st = _loss_state(block, Z, params.loss)
        G = block.tmv(st.dz)
        G += W
        done = active & (np.sqrt(block.col_dot(G, G)) <= tol)
        block.stats.converged += int(done.sum())
        active &= ~done
    W_out[:, cols] = W
    return W_out


def _pcg(block: Block, G: np.ndarray, curv: np.ndarray, active: np.ndarray, max_cg_iter: int) -> np.ndarray:
    """Approximately solve ``H s = -g`` per problem (LIBLINEAR's preconditioned CG).

    In-place updates on preallocated arrays (allocating ``F x n`` arrays per step costs as much
    as the arithmetic). The quadratic model ``Q(s) = g.s + s.Hs / 2`` of the stopping rule is
    updated as ``Q -= alpha z.r / 2`` (exact for CG), which saves two passes per step.
    """
    M = block.tmv(curv, squared=True)
    M *= np.float32(PRECOND_MIX)
    M += np.float32(1.0)  # (1 - a) + a diag(H)
    S = np.zeros_like(G)
    Rr = -G
    Zp = Rr / M
    D = Zp.copy()
    zTr = block.col_dot(Zp, Rr)
    cgtol = np.minimum(np.sqrt(np.sqrt(zTr)), np.float32(EPS_CG))
    Q = np.zeros_like(zTr)
    act = active.copy()
    zero = np.zeros_like(zTr)
    for it in range(1, max_cg_iter + 1):
        block.stats.cg_iters += 1
        XD = block.mv(D)
        XD *= curv
        HD = block.tmv(XD)
        HD += D
        dHd = block.col_dot(D, HD)
        act &= dHd > 1e-16
        a = np.where(act, zTr / np.maximum(dHd, np.float32(1e-16)), zero)
        a_cols = block.to_cols(a)
        S += a_cols * D
        Rr -= a_cols * HD
        newQ = Q - np.float32(0.5) * a * zTr
        act &= it * (newQ - Q) < cgtol * newQ
        Q = newQ
        if not act.any():
            break
        np.divide(Rr, M, out=Zp)
        znew = block.col_dot(Zp, Rr)
        beta = np.where(act, znew / np.maximum(zTr, np.float32(1e-30)), zero)
        D *= block.to_cols(beta)
        D += Zp
        zTr = znew
    return S


class _Point(NamedTuple):
    """The problems' current iterate: weights, margins ``X W``, gradient, objective, ``w^T w``."""

    W: np.ndarray
    Z: np.ndarray
    G: np.ndarray
    fval: np.ndarray
    wTw: np.ndarray


def _line_search(
    block: Block, point: _Point, S: np.ndarray, XS: np.ndarray, active: np.ndarray, loss: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per-problem Armijo backtracking along ``S`` (``XS = X S``) from step 1; step 0 where it
    fails or the problem is inactive."""
    W, Z, G, fval, wTw = point
    gTs = block.col_dot(G, S)
    wTs = block.col_dot(W, S)
    sTs = block.col_dot(S, S)
    alpha = np.ones_like(fval)
    accepted = np.zeros_like(active)
    fnew = fval.copy()
    todo = active & (gTs < 0)
    for _ in range(MAX_LINE_SEARCH):
        f_try = np.float32(0.5) * (wTw + 2.0 * alpha * wTs + alpha * alpha * sTs) + _loss_values(
            block, Z + block.to_rows(alpha) * XS, loss
        )
        ok = todo & ~accepted & (f_try - fval <= ARMIJO_ETA * alpha * gTs)
        fnew = np.where(ok, f_try, fnew)
        accepted |= ok
        if (accepted | ~todo).all():
            break
        alpha = np.where(accepted, alpha, np.float32(0.5) * alpha)
    return np.where(accepted, alpha, np.zeros_like(alpha)), fnew
