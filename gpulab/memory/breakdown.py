"""Where the bytes of a training step go: one number per category, as a table or a bar chart.

    b = MemoryBreakdown(parameters=4 * 2**20, gradients=4 * 2**20, optimizer=8 * 2**20,
                        activations=30 * 2**20)
    print(b.table())           # category, MiB, share of the total
    b.plot()                   # a horizontal stacked bar (matplotlib)

Both sides of the course's "estimate vs measure" produce one: gpulab.memory.estimate on paper,
gpulab.memory.measure from a real step. The categories:

    parameters   the weights (and buffers) of the model
    gradients    .grad of each parameter
    optimizer    optimizer state (SGD momentum; Adam exp_avg and exp_avg_sq; fp32 master copies)
    activations  tensors made by the forward pass, most of them saved for backward
    temporary    short-lived tensors: gradients of activations in backward, the optimizer's
                 scratch, workspaces
    other        the batch, and whatever else was live

Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporary", "other")
COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868",
          "activations": "#c44e52", "temporary": "#8172b3", "other": "#937860"}
MiB = 2**20


def format_bytes(n: float) -> str:
    """Bytes in binary units, as CUDA's error messages write them: '20.00 MiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per category at one moment (usually the peak of a training step)."""

    parameters: int = 0  # model weights and buffers
    gradients: int = 0  # param.grad
    optimizer: int = 0  # optimizer state
    activations: int = 0  # forward-pass tensors (saved for backward, or not yet freed)
    temporary: int = 0  # backward's activation gradients, optimizer scratch, workspaces
    other: int = 0  # the batch and anything else

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def dominant(self) -> str:
        """The category holding the most bytes."""
        sizes = self.as_dict()
        return max(sizes, key=sizes.get)

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        return MemoryBreakdown(**{k: v + getattr(other, k) for k, v in asdict(self).items()})

    def table(self, title: str = "") -> str:
        """A text table: category, MiB, share of the total."""
        total = self.total or 1
        lines = [title] if title else []
        lines += [f"{'category':<12} {'MiB':>10} {'share':>7}", "-" * 31]
        for name, nbytes in self.as_dict().items():
            lines.append(f"{name:<12} {nbytes / MiB:>10.3f} {nbytes / total:>7.1%}")
        lines.append(f"{'total':<12} {self.total / MiB:>10.3f} {1:>7.0%}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None, label: str = "step"):
        """A horizontal bar stacked by category, in MiB (matplotlib); returns the Axes."""
        return plot_breakdowns({label: self}, ax=ax)


def plot_breakdowns(breakdowns: dict[str, MemoryBreakdown], ax=None):
    """Several breakdowns as stacked bars, one per row, e.g. {"estimate": e, "measured": m}."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 0.6 + 0.6 * len(breakdowns)))[1]
    for row, breakdown in enumerate(breakdowns.values()):
        left = 0.0
        for name, nbytes in breakdown.as_dict().items():
            ax.barh(row, nbytes / MiB, left=left, color=COLORS[name],
                    label=name if row == 0 else None)
            left += nbytes / MiB
    ax.set_yticks(range(len(breakdowns)), labels=list(breakdowns))
    ax.invert_yaxis()  # first entry on top
    ax.set_xlabel("MiB")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(CATEGORIES),
              fontsize="small", frameon=False)
    return ax
