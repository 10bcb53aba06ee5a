"""What the training checkers share (Labs 2 onwards): tiny problems built by the checker,
one-thread runs, calling the learner's function with errors that teach, and loss and gradient
comparisons with tolerances that fit bf16.

Everything runs on the CPU, on either runner: precision in bf16; where the GradScaler's logic is
graded, a scaler is switched on next to bf16 (the same algebra on CPU tensors). fp16 never runs
here: a CPU emulates it, ~100x slower.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from gpulab.env import AutocastRecipe
from gpulab.models import MLP
from gpulab.stubs import STUB_HINT, is_stub_error, not_started

BF16 = AutocastRecipe("cpu", "bfloat16", use_grad_scaler=False)  # the cpu runner's recipe
BF16_SCALED = AutocastRecipe("cpu", "bfloat16", use_grad_scaler=True)  # + a scaler, as fp16 has
SCALE = 2.0**10  # the checkers' GradScaler init_scale: a power of two, so scaling is exact
AMP_RTOL = 3e-2  # a bf16 loss lies within 3% of the fp32 one (8 significant bits)
GRAD_RTOL = 2e-2  # bf16 gradients summed in another order: within 2% of the largest entry
UPDATE_RTOL = 1e-2  # the same step computed twice: the updates agree to 1%
LR = 0.5  # plain SGD: the update is -LR * grad, so any wrong gradient shows in the weights
N_FEATURES, N_CLASSES = 12, 5

@contextmanager
def one_thread():
    """Run the body on one CPU thread. The checkers' models are tiny: one thread runs them
    fastest, and other processes competing for the cores (a grading machine runs several
    submissions at once) cannot slow it down tenfold. The learner's setting comes back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


HINTS = (  # (text in the error, what to look at)
    ("No inf checks were recorded", "scaler.update() found no gradients checked for inf: it "
     "comes after scaler.step(optimizer), and the gradients must still be in .grad at the step "
     "(no zero_grad between backward and the step)."),
    ("unscale_() has already been called", "Call scaler.unscale_(optimizer) once per step, "
     "before clipping; scaler.step does not unscale a second time."),
    ("_scale is None", "Run backward on scaler.scale(loss), not on the loss: the scaler sets "
     "up its scale there, and unscale_ and step divide by it."),
    ("does not require grad", "backward needs the loss as computed from the model's output: "
     "do not detach it (or compute it under torch.no_grad()) before backward."),
    ("same device", "Every tensor of a step must be on the model's device: move the model with "
     ".to(device) and each batch with to_device."),
)


def hint_for(error: Exception) -> str:
    if isinstance(error, NotImplementedError):
        return STUB_HINT
    for text, hint in HINTS:
        if text in str(error):
            return hint
    return "Look at the line of your code that raised it."


def call_learner(fn, name: str, *args, case: str = ""):
    """fn(*args); an error becomes an AssertionError that says which call failed and why
    ("not started" for the lab's stub)."""
    try:
        return fn(*args)
    except Exception as error:  # the learner's code may raise anything; say what it means
        if is_stub_error(error):
            raise AssertionError(not_started(name)) from error
        first = (str(error).strip().splitlines() or [""])[0][:300]
        said = f"{type(error).__name__}: {first}" if first else type(error).__name__
        raise AssertionError(f"{name} ({case}) raised {said}\n{hint_for(error)}") from error


class StepWatch(TorchFunctionMode):
    """While active, records each tensor copy (.to / .cuda) and whether it was asynchronous,
    and whether autocast was on at each Linear layer and at each backward()."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.copies: list[bool] = []  # non_blocking of each copy
        self.linear_in_autocast: list[bool] = []
        self.backward_in_autocast: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda"):
            self.copies.append(kwargs.get("non_blocking") is True
                               or any(a is True for a in args[2:]))
        elif name in ("linear", "backward"):
            on = torch.is_autocast_enabled(self.device_type)
            (self.linear_in_autocast if name == "linear" else self.backward_in_autocast).append(on)
        return func(*args, **kwargs)


def tiny_problem(seed: int, n: int, hidden: int = 32, n_hidden: int = 1, dropout: float = 0.0):
    """A small classifier and n examples for it, made from `seed` without touching torch's
    global random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(N_FEATURES, N_CLASSES, hidden=hidden, n_hidden=n_hidden, dropout=dropout)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, N_FEATURES, generator=g)  # (n, F)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)  # (n,)
    return model, x, y


def make_scaler(enabled: bool, growth_interval: int = 1):
    return torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=growth_interval,
                                enabled=enabled)


def scaler_name(enabled: bool) -> str:
    return f"GradScaler(init_scale={SCALE:g})" if enabled else "no GradScaler"


def param_copies(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def fill_stale_grads(model, value: float) -> None:
    """Leave gradients in .grad, as the previous step does."""
    for p in model.parameters():
        p.grad = torch.full_like(p, value)


def as_loss(value, name: str, case: str) -> float:
    """The loss a step returned, which must be a detached one-element tensor, as a float."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise AssertionError(
            f"{name} ({case}) returned the number {value!r}: return the loss as a tensor, "
            "loss.detach(). Making it a Python number (.item(), float()) makes the host wait "
            "for the GPU to finish, every step; convert many losses at once when you log.")
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"{name} ({case}) returned {type(value).__name__}; return the loss "
                             "as a tensor: loss.detach().")
    if value.requires_grad:
        raise AssertionError(
            f"{name} ({case}) returned a loss still attached to the autograd graph: return "
            "loss.detach(), or the graph (and every activation it holds) stays alive as long "
            "as the loss does.")
    if value.numel() != 1:
        raise AssertionError(f"{name} ({case}) returned a tensor of shape "
                             f"{tuple(value.shape)}; the loss is one number, the batch's mean.")
    return float(value.detach().reshape(()).float().cpu())


def check_loss(got: float, want: float, fp32: float, name: str, case: str, scale: float,
                watch: StepWatch) -> None:
    times = math.log2(got / want) if scale != 1 and got > 1.5 * want > 0 else 0.5
    if abs(times - round(times)) < 1e-3:  # a power of two: the loss times the scale
        raise AssertionError(f"{name} ({case}) returned {got:.4f}, the loss times the scale "
                             f"({2**round(times):g}): return the loss itself, not "
                             "scaler.scale(loss).")
    if watch.linear_in_autocast and not all(watch.linear_in_autocast):
        raise AssertionError(
            f"{name} ({case}): the model's forward pass ran outside autocast. Compute "
            "model(x) and the loss inside `with torch.autocast(recipe.device_type, "
            "dtype=recipe.dtype):`, with the recipe passed in (never a hard-coded device).")
    if not math.isclose(got, fp32, rel_tol=AMP_RTOL):
        raise AssertionError(
            f"{name} ({case}) returned a loss of {got:.5f}; the cross-entropy of the model on "
            f"this batch is {want:.5f} under bf16 autocast ({fp32:.5f} in fp32). Return the "
            "mean cross-entropy F.cross_entropy(model(x), y), computed before the step.")


def check_backward_outside_autocast(watch: StepWatch, name: str, case: str) -> None:
    inside = sum(watch.backward_in_autocast)
    if inside:
        raise AssertionError(
            f"{name} ({case}): backward ran inside torch.autocast ({inside} of "
            f"{len(watch.backward_in_autocast)} backward calls). End the `with` block after "
            "the loss: autocast is for the forward pass, and backward already runs each op in "
            "the dtype its forward used.")
