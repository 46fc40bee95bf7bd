"""Batched primal Newton-CG for many independent L2-regularised binary linear problems.

A *block* stacks ``T`` tasks (clusters) block-diagonally: task ``t`` owns a set of rows (its
training instances) and a set of columns (the features that occur in those rows, plus the bias
column), and ``n`` label slots. Problem ``(t, j)`` is the binary classifier of the ``j``-th label
of task ``t``; a slot with zero cost everywhere is padding (its solution stays 0). So every
problem of the block shares one sparse matrix, and every step is one sparse-times-dense product
(``X @ V`` or ``X^T @ U`` with ``V`` of shape ``F_block x n``) plus elementwise work, whatever the
number of tasks: no Python loop over labels or clusters.

Objective of each problem (LIBLINEAR's primal, bias regularised like LIBLINEAR/PECOS)::

    f(w) = 1/2 ||w||^2 + sum_i c_i loss(y_i w.x_i)

with ``loss(m) = max(0, 1 - m)^2`` (squared hinge) or ``log(1 + exp(-m))`` (logistic) and
``c_i = Cp`` for positives, ``Cn`` for negatives. The method is LIBLINEAR's (>= 2.40) Newton with
a line search: diagonally preconditioned CG (preconditioner ``(1 - a) + a diag(H)``, ``a = 0.01``;
stop on the quadratic-model decrease rule with ``eps_cg = 0.5``), then a backtracking Armijo line
search (``eta = 0.01``) that costs no extra sparse product because ``X (w + alpha s) = Xw + alpha Xs``.
All per-problem scalars are ``T x n`` tensors obtained by segment sums over the block's sorted
rows/columns. A problem stops when ``||grad|| <= eps * ||grad at w = 0||`` or after ``max_iter``
Newton iterations; finished problems are frozen (their step is 0) while the others go on.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from xtransformer.ranker.errors import RankerError

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
    eps: float = 0.01
    max_iter: int = 10
    max_cg_iter: int = 20


@dataclass
class SolveStats:
    newton_iters: int = 0
    cg_iters: int = 0
    spmm: int = 0
    problems: int = 0
    converged: int = 0

    def add(self, other: "SolveStats") -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass(eq=False)
class Block:
    """``T`` tasks stacked block-diagonally; rows and columns sorted by task."""

    X: torch.Tensor  # R x Fb sparse csr
    XT: torch.Tensor  # Fb x R sparse csr
    Y: torch.Tensor  # R x n, +1 / -1
    cost: torch.Tensor  # R x n, c_i per problem; 0 = padding
    row_len: torch.Tensor  # T, rows per task
    col_len: torch.Tensor  # T, columns per task
    stats: SolveStats = field(default_factory=SolveStats)

    @classmethod
    def from_scipy(
        cls, Xb: sp.csr_matrix, row_len: np.ndarray, col_len: np.ndarray, Y: np.ndarray, cost: np.ndarray
    ) -> "Block":
        if Xb.shape != (int(row_len.sum()), int(col_len.sum())) or Y.shape != cost.shape or Y.shape[0] != Xb.shape[0]:
            raise RankerError(
                f"solver block: inconsistent shapes X {Xb.shape}, rows {int(row_len.sum())}, "
                f"cols {int(col_len.sum())}, Y {Y.shape}, cost {cost.shape}"
            )
        XT = Xb.T.tocsr()
        XT.sort_indices()
        return cls(
            X=_torch_csr(Xb, Xb.data),
            XT=_torch_csr(XT, XT.data),
            Y=torch.from_numpy(np.ascontiguousarray(Y, dtype=np.float32)),
            cost=torch.from_numpy(np.ascontiguousarray(cost, dtype=np.float32)),
            row_len=torch.from_numpy(row_len.astype(np.int64)),
            col_len=torch.from_numpy(col_len.astype(np.int64)),
        )

    def columns(self, cols: slice | torch.Tensor, share_stats: bool = False) -> "Block":
        """The same tasks and matrices restricted to label slots ``cols``."""
        return Block(
            self.X, self.XT, self.Y[:, cols].contiguous(), self.cost[:, cols].contiguous(),
            self.row_len, self.col_len, self.stats if share_stats else SolveStats(),
        )

    @property
    def n_tasks(self) -> int:
        return int(self.row_len.numel())

    # per-problem reductions (T x n) and their broadcasts back to rows / columns
    def row_sum(self, A: torch.Tensor) -> torch.Tensor:
        return _segment_sum(A, self.row_len)

    def col_dot(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """Per-problem dot products of two ``Fb x n`` tensors (``T x n``)."""
        if self.col_len.numel() == 1:
            return torch.linalg.vecdot(A, B, dim=0).unsqueeze(0)
        return _segment_sum(A * B, self.col_len)

    def to_rows(self, v: torch.Tensor) -> torch.Tensor:
        return _expand(v, self.row_len)

    def to_cols(self, v: torch.Tensor) -> torch.Tensor:
        return _expand(v, self.col_len)

    def mv(self, V: torch.Tensor) -> torch.Tensor:
        self.stats.spmm += 1
        return self.X @ V

    def tmv(self, U: torch.Tensor, squared: bool = False) -> torch.Tensor:
        """``X^T @ U``, or ``(X * X)^T @ U`` (for diag(H)) with the squares made on the fly (memory)."""
        self.stats.spmm += 1
        if not squared:
            return self.XT @ U
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            XT_sq = torch.sparse_csr_tensor(
                self.XT.crow_indices(), self.XT.col_indices(), self.XT.values().square(), self.XT.shape, check_invariants=False
            )
        return XT_sq @ U


def _torch_csr(M: sp.csr_matrix, data: np.ndarray) -> torch.Tensor:
    # int32 indices: MKL's sparse kernels run ~2x faster than with int64 here
    idx_dtype = np.int32 if M.nnz < 2**31 - 1 else np.int64
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(M.indptr.astype(idx_dtype, copy=False)),
            torch.from_numpy(M.indices.astype(idx_dtype, copy=False)),
            torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)),
            size=M.shape,
            check_invariants=False,
        )


def _segment_sum(A: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    if lengths.numel() == 1:
        return A.sum(0, keepdim=True)
    return torch.segment_reduce(A, "sum", lengths=lengths, axis=0, unsafe=True)


def _expand(v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    if lengths.numel() == 1:
        return v  # broadcasts
    return v.repeat_interleave(lengths, dim=0, output_size=int(lengths.sum()))


# ---------------------------------------------------------------------------------------------- loss
@dataclass
class _LossState:
    value: torch.Tensor  # T x n, loss part of the objective
    dz: torch.Tensor  # R x n, d loss / d z
    curv: torch.Tensor  # R x n, d^2 loss / d z^2 (generalised for the squared hinge)


def _loss_values(block: Block, Z: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "squared_hinge":
        m = torch.clamp_min(1.0 - block.Y * Z, 0.0)
        return block.row_sum(block.cost * m * m)
    return block.row_sum(block.cost * F.softplus(-block.Y * Z))


def _loss_state(block: Block, Z: torch.Tensor, loss: str) -> _LossState:
    if loss == "squared_hinge":
        m = torch.clamp_min(1.0 - block.Y * Z, 0.0)
        cm = block.cost * m
        return _LossState(
            value=block.row_sum(cm * m),
            dz=-2.0 * cm * block.Y,
            curv=2.0 * block.cost * (m > 0),
        )
    if loss == "logistic":
        yz = block.Y * Z
        s = torch.sigmoid(-yz)
        return _LossState(
            value=block.row_sum(block.cost * F.softplus(-yz)),
            dz=-block.cost * block.Y * s,
            curv=block.cost * s * (1.0 - s),
        )
    raise RankerError(f"solver: loss must be 'squared_hinge' or 'logistic', got {loss!r}")


# ---------------------------------------------------------------------------------------------- Newton
def solve_block(block: Block, params: SolverParams) -> torch.Tensor:
    """Solve every problem of ``block``; return the weights ``Fb x n`` (float32).

    Label slots whose problems have all stopped are dropped from the tensors (once at most
    ``COMPACT_AT`` of them are still live), so the few slow problems do not drag the others'
    columns through every sparse product.
    """
    n = block.Y.shape[1]
    W_out = torch.zeros(block.XT.shape[0], n)
    cols = torch.arange(n)
    W = W_out.clone()
    Z = torch.zeros(block.Y.shape[0], n)
    is_problem = block.row_sum(block.cost) > 0  # T x n: padding slots are no problem
    st = _loss_state(block, Z, params.loss)
    G = block.tmv(st.dz)  # gradient at w = 0 (the regulariser's gradient is 0 there)
    gnorm0 = block.col_dot(G, G).sqrt_()
    tol = params.eps * gnorm0
    active = is_problem & (gnorm0 > 0)
    block.stats.problems += int(is_problem.sum())
    block.stats.converged += int((is_problem & ~active).sum())
    fval = st.value
    wTw = torch.zeros_like(fval)
    for _ in range(params.max_iter):
        live = active.any(0)
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live <= COMPACT_AT * len(cols):
            W_out[:, cols] = W
            keep = live.nonzero().squeeze(1)
            cols = cols[keep]
            block = block.columns(keep, share_stats=True)
            W, Z, G = W[:, keep], Z[:, keep], G[:, keep]
            st = _LossState(st.value[:, keep], st.dz[:, keep], st.curv[:, keep])
            fval, wTw, tol, active = fval[:, keep], wTw[:, keep], tol[:, keep], active[:, keep]
        block.stats.newton_iters += 1
        S = _pcg(block, G, st.curv, active, params.max_cg_iter)
        XS = block.mv(S)
        alpha, fnew = _line_search(block, Z, XS, S, W, G, fval, wTw, active, params.loss)
        moved = alpha > 0
        active &= moved  # a failed line search ends that problem, as in LIBLINEAR
        W.addcmul_(block.to_cols(alpha), S)
        Z.addcmul_(block.to_rows(alpha), XS)
        fval = torch.where(moved, fnew, fval)
        wTw = block.col_dot(W, W)
        st = _loss_state(block, Z, params.loss)
        G = block.tmv(st.dz).add_(W)
        done = active & (block.col_dot(G, G).sqrt_() <= tol)
        block.stats.converged += int(done.sum())
        active &= ~done
    W_out[:, cols] = W
    return W_out


def _pcg(block: Block, G: torch.Tensor, curv: torch.Tensor, active: torch.Tensor, max_cg_iter: int) -> torch.Tensor:
    """Approximately solve ``H s = -g`` per problem (LIBLINEAR's preconditioned CG).

    In-place updates on preallocated tensors (allocating ``F x n`` tensors per step costs as much
    as the arithmetic). The quadratic model ``Q(s) = g.s + s.Hs / 2`` of the stopping rule is
    updated as ``Q -= alpha z.r / 2`` (exact for CG), which saves two passes per step.
    """
    M = block.tmv(curv, squared=True).mul_(PRECOND_MIX).add_(1.0)  # (1 - a) + a diag(H)
    S = torch.zeros_like(G)
    Rr = torch.neg(G)
    Zp = torch.div(Rr, M)
    D = Zp.clone()
    zTr = block.col_dot(Zp, Rr)
    cgtol = torch.clamp(zTr.sqrt().sqrt(), max=EPS_CG)
    Q = torch.zeros_like(zTr)
    act = active.clone()
    zero = torch.zeros_like(zTr)
    for it in range(1, max_cg_iter + 1):
        block.stats.cg_iters += 1
        HD = block.tmv(block.mv(D).mul_(curv)).add_(D)
        dHd = block.col_dot(D, HD)
        act &= dHd > 1e-16
        a = torch.where(act, zTr / dHd.clamp_min(1e-16), zero)
        a_cols = block.to_cols(a)
        S.addcmul_(a_cols, D)
        Rr.addcmul_(a_cols, HD, value=-1.0)
        newQ = Q - 0.5 * a * zTr
        act &= it * (newQ - Q) < cgtol * newQ
        Q = newQ
        if not bool(act.any()):
            break
        torch.div(Rr, M, out=Zp)
        znew = block.col_dot(Zp, Rr)
        beta = torch.where(act, znew / zTr.clamp_min(1e-30), zero)
        D.mul_(block.to_cols(beta)).add_(Zp)
        zTr = znew
    return S


def _line_search(
    block: Block,
    Z: torch.Tensor,
    XS: torch.Tensor,
    S: torch.Tensor,
    W: torch.Tensor,
    G: torch.Tensor,
    fval: torch.Tensor,
    wTw: torch.Tensor,
    active: torch.Tensor,
    loss: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-problem Armijo backtracking from step 1; step 0 where it fails or the problem is inactive."""
    gTs = block.col_dot(G, S)
    wTs = block.col_dot(W, S)
    sTs = block.col_dot(S, S)
    alpha = torch.ones_like(fval)
    accepted = torch.zeros_like(active)
    fnew = fval.clone()
    todo = active & (gTs < 0)
    for _ in range(MAX_LINE_SEARCH):
        f_try = 0.5 * (wTw + 2.0 * alpha * wTs + alpha * alpha * sTs) + _loss_values(
            block, Z + block.to_rows(alpha) * XS, loss
        )
        ok = todo & ~accepted & (f_try - fval <= ARMIJO_ETA * alpha * gTs)
        fnew = torch.where(ok, f_try, fnew)
        accepted |= ok
        if bool((accepted | ~todo).all()):
            break
        alpha = torch.where(accepted, alpha, 0.5 * alpha)
    return torch.where(accepted, alpha, torch.zeros_like(alpha)), fnew
