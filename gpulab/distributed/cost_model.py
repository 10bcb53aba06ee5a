"""The alpha-beta cost model of collectives, and bandwidth as nccl-tests reports it.

Sending a message of m bytes costs alpha + m / beta: alpha is the latency of one message
(seconds), beta the link bandwidth (bytes/s). A collective on p ranks is a schedule of such
messages, so its time is (number of sequential steps) * alpha + (bytes on the busiest link) / beta.
n_bytes is always the size of the whole buffer, as nccl-tests counts it: the tensor given to
all_reduce or broadcast, the *output* of all_gather, the *input* of reduce_scatter.

    collective       algorithm                   time
    all_reduce       ring                        2(p-1) alpha + 2(p-1)/p n/beta
    all_reduce       binary tree (reduce+bcast)  2 ceil(log2 p) (alpha + n/beta)
    all_gather       ring                        (p-1) alpha + (p-1)/p n/beta
    reduce_scatter   ring                        (p-1) alpha + (p-1)/p n/beta
    broadcast        binomial tree               ceil(log2 p) (alpha + n/beta)
    reduce           binomial tree               ceil(log2 p) (alpha + n/beta)

nccl-tests reports two bandwidths: algbw = n_bytes / time, what the caller sees, and
busbw = algbw * factor, the bandwidth each link must carry, comparable to the hardware peak
whatever p is: factor 2(p-1)/p for all_reduce, (p-1)/p for all_gather, reduce_scatter and
all_to_all, 1 for broadcast and reduce.
Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _steps_and_bytes(collective: str, p: int, algorithm: str) -> tuple[float, float]:
    """(message latencies paid, fraction of n_bytes through the busiest link) for one run."""
    if p < 1:
        raise ValueError(f"world size must be at least 1, got {p}")
    if p == 1:
        return 0.0, 0.0  # nothing to send
    depth = math.ceil(math.log2(p))
    table = {
        ("all_reduce", "ring"): (2 * (p - 1), 2 * (p - 1) / p),
        ("all_reduce", "tree"): (2 * depth, 2 * depth),
        ("all_gather", "ring"): (p - 1, (p - 1) / p),
        ("reduce_scatter", "ring"): (p - 1, (p - 1) / p),
        ("broadcast", "tree"): (depth, depth),
        ("reduce", "tree"): (depth, depth),
    }
    try:
        return table[(collective, algorithm)]
    except KeyError:
        known = ", ".join(f"{c}/{a}" for c, a in table)
        raise ValueError(f"no model for {collective!r} with {algorithm!r}; known: {known}") \
            from None


DEFAULT_ALGORITHM = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
                     "broadcast": "tree", "reduce": "tree"}


def collective_time(collective: str, n_bytes: float, p: int, alpha: float, beta: float,
                    algorithm: str | None = None) -> float:
    """Predicted seconds for `collective` on p ranks of an n_bytes buffer (see module doc)."""
    steps, volume = _steps_and_bytes(collective, p, algorithm or DEFAULT_ALGORITHM[collective])
    return steps * alpha + volume * n_bytes / beta


def ring_all_reduce_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """2(p-1) alpha + 2(p-1)/p n/beta: bandwidth term nearly independent of p."""
    return collective_time("all_reduce", n_bytes, p, alpha, beta, "ring")


def tree_all_reduce_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """2 ceil(log2 p) (alpha + n/beta): fewer latencies than the ring, more bytes per link."""
    return collective_time("all_reduce", n_bytes, p, alpha, beta, "tree")


def all_gather_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """(p-1) alpha + (p-1)/p n/beta, n_bytes being the gathered output."""
    return collective_time("all_gather", n_bytes, p, alpha, beta)


def reduce_scatter_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """(p-1) alpha + (p-1)/p n/beta, n_bytes being the input; half a ring all-reduce."""
    return collective_time("reduce_scatter", n_bytes, p, alpha, beta)


def broadcast_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """ceil(log2 p) (alpha + n/beta): a binomial tree doubles the ranks holding the data."""
    return collective_time("broadcast", n_bytes, p, alpha, beta)


BUSBW_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
                "reduce_scatter": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p,
                "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}


def algbw(n_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s): buffer size over time, as nccl-tests prints."""
    return n_bytes / seconds / 1e9


def busbw(collective: str, algbw_gbps: float, p: int) -> float:
    """Bus bandwidth in GB/s: algbw times the collective's factor (module doc)."""
    return algbw_gbps * BUSBW_FACTOR[collective](p)


@dataclass(frozen=True)
class LinkFit:
    """alpha and beta fitted to measured times of one collective."""

    alpha: float  # seconds per message (latency)
    beta: float  # bytes per second per link
    collective: str  # what was measured, e.g. "all_reduce"
    algorithm: str  # the schedule assumed, e.g. "ring"
    p: int  # world size of the measurements
    rms_error: float  # root mean square of (measured - predicted) seconds

    def predict(self, n_bytes) -> np.ndarray:
        """Predicted seconds for each size in n_bytes."""
        sizes = np.asarray(n_bytes, dtype=float)
        return collective_time(self.collective, sizes, self.p, self.alpha, self.beta,
                               self.algorithm)


def fit_alpha_beta(n_bytes, seconds, p: int, collective: str = "all_reduce",
                   algorithm: str | None = None) -> LinkFit:
    """Least-squares alpha and beta from times measured at several sizes.

    The model is linear in (alpha, 1/beta): t = steps * alpha + volume * n * (1/beta). Sizes
    usually span decades, so the fit minimises *relative* errors (each row divided by its
    measured time); plain least squares would fit the largest sizes and ignore alpha. A fitted
    alpha below zero (noise at small sizes) is clamped to 0 and 1/beta refitted alone."""
    algorithm = algorithm or DEFAULT_ALGORITHM[collective]
    steps, volume = _steps_and_bytes(collective, p, algorithm)
    n = np.asarray(n_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.size < 2 or np.unique(n).size < 2:
        raise ValueError("need times measured at two or more different sizes")
    if steps == 0:
        raise ValueError("with one rank nothing is sent: measure with p >= 2")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    design = np.stack([np.full_like(n, steps), volume * n], axis=1)  # (sizes, 2)
    scaled = design / t[:, None]  # relative residuals: (design @ x - t) / t
    (alpha, inv_beta), *_ = np.linalg.lstsq(scaled, np.ones_like(t), rcond=None)
    if alpha < 0:
        column = scaled[:, 1]
        alpha, inv_beta = 0.0, float(column.sum() / (column @ column))
    if inv_beta <= 0:
        raise ValueError("the times do not grow with size: measure larger buffers")
    rms = float(np.sqrt(np.mean((design @ np.array([alpha, inv_beta]) - t) ** 2)))
    return LinkFit(float(alpha), float(1.0 / inv_beta), collective, algorithm, p, rms)
