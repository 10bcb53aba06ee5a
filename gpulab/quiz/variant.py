"""Each learner's own numbers for the quiz's numeric questions, drawn from their id.

    mine = variant(LEARNER)    # LEARNER's numbers; JupyterHub's user when LEARNER is empty
    mine.show("q02")           # prints q02's numbers: gpu = 'H100 SXM', rows = 8192, ...
    mine.q02.gpu               # what an answer cell computes with
    draw("ada")                # the same numbers from the id alone: the grader's way

Why: two learners' answer sheets must not be interchangeable. Each field of a numeric
question (a GPU, a model size, a world size, a bandwidth...) is drawn from its choices by a
sha256 of the course's SALT, the learner's id, the question and the field. So a learner's
numbers are the same in every run, on every machine and in the grader, which computes the
expected answers from the id a notebook was handed in under (gpulab/checks/quiz/expected.py).
The multiple-choice questions are the same for everyone.

The choices are fixed lists, not "every GPU of the spec sheet": a row added to the table must
not change a learner's numbers between their notebook and their grade. Every combination is a
question worth asking (tests/test_quiz_variants.py tries them all): the thresholds never fall
on a whole number of tokens, nodes or microbatches (a rounding in the learner's arithmetic
cannot flip a count), the all-reduce's latency term always matters, and each known slip
(tests/test_quiz_slips.py) misses the answer by more than the grader's tolerance.
Taught in: the course quiz, solutions/quiz/quiz.ipynb.
"""

import dataclasses
import hashlib
import os
from dataclasses import dataclass

# A new salt draws new numbers for everyone (a new class, or new questions: edition 2 asks
# inverses and comparisons); notebooks and grader must agree.
SALT = "gpulab quiz, edition 2"
HUB_USER = "JUPYTERHUB_USER"  # set by JupyterHub in each learner's server, and by the grader


def choices(*options):
    """A field drawn from `options` (dataclasses.field metadata, read by `draw`)."""
    return dataclasses.field(metadata={"choices": options})


@dataclass(frozen=True)
class ComputeBoundTokens:
    """q02: the fewest tokens for which x @ W, W of shape (hidden, 4 * hidden), is compute-bound
    in bf16 on `gpu` (the first linear layer of a transformer's MLP)."""

    gpu: str = choices("A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200", "L4", "MI300X")
    hidden: int = choices(2048, 4096, 8192)


@dataclass(frozen=True)
class SpotNodes:
    """q03: the most spot nodes a synchronous job may run on and keep its preemption loss to a
    bound, checkpointing every `checkpoint_minutes`."""

    preemptions_per_node_hour: float = choices(0.005, 0.01, 0.02, 0.03)
    checkpoint_minutes: int = choices(15, 30, 45)
    restart_minutes: int = choices(2, 4, 7)
    max_loss_percent: int = choices(3, 4, 5)  # of the running time


@dataclass(frozen=True)
class StridedLoad:
    """q04: a warp's 32 threads each load x[stride * i], elements of `dtype`."""

    stride: int = choices(2, 3, 4, 5, 6, 7)
    dtype: str = choices("float16", "float32")


@dataclass(frozen=True)
class LinkForBudget:
    """q13: the link bandwidth at which a ring all-reduce of n_bytes on world_size GPUs takes
    budget_ms, by the alpha-beta model."""

    n_bytes: float = choices(100e6, 250e6, 500e6)  # one gradient bucket
    world_size: int = choices(16, 32, 64)
    alpha: float = choices(20e-6, 30e-6, 50e-6)  # seconds per message, across nodes
    budget_ms: int = choices(10, 15, 20)


@dataclass(frozen=True)
class AlgbwElsewhere:
    """q14: the algbw nccl-tests prints for a large all-reduce on other_world_size GPUs, from
    the algbw it printed on world_size GPUs of the same kind."""

    algbw_gbps: int = choices(40, 80, 120, 160, 200)
    world_size: int = choices(4, 8)
    other_world_size: int = choices(2, 16, 32)


@dataclass(frozen=True)
class Zero2LargestModel:
    """q15: the largest model whose mixed-precision Adam states ZeRO-2 holds on world_size
    `gpu`s beside the reserve."""

    gpu: str = choices("A100 40GB SXM", "A100 80GB SXM", "H200", "MI300X")
    world_size: int = choices(8, 16, 32, 64)
    reserved_gb: int = choices(8, 16, 24)  # per GPU, for activations and buffers


@dataclass(frozen=True)
class MicrobatchesForBubble:
    """q19: the fewest microbatches (a multiple of pp_size) that hold interleaved 1F1B's bubble
    on pp_size GPUs, n_chunks model chunks each, to max_bubble_percent."""

    pp_size: int = choices(4, 8)
    n_chunks: int = choices(2, 4)
    max_bubble_percent: int = choices(3, 5, 8, 10)  # of the GPU-time


@dataclass(frozen=True)
class MasterlessFit:
    """q22: the largest model one `gpu` fine-tunes in bf16, trained by `optimizer` with no
    master copy, beside the reserve."""

    gpu: str = choices("L4", "A100 40GB SXM", "A100 80GB SXM", "H200")
    reserved_gb: int = choices(4, 8, 12)  # for activations and buffers
    optimizer: str = choices("adamw", "sgd-momentum")  # gpulab.memory.recipes' names


@dataclass(frozen=True)
class Variant:
    """One learner's numbers, question by question (the numeric questions only)."""

    learner: str  # the id they were drawn from
    q02: ComputeBoundTokens
    q03: SpotNodes
    q04: StridedLoad
    q13: LinkForBudget
    q14: AlgbwElsewhere
    q15: Zero2LargestModel
    q19: MicrobatchesForBubble
    q22: MasterlessFit

    @classmethod
    def questions(cls) -> dict:
        """{question: the class of its numbers}, in the quiz's order."""
        return {f.name: f.type for f in dataclasses.fields(cls) if f.name != "learner"}

    def describe(self, question: str) -> str:
        """`question`'s numbers, one per line, as `show` prints them."""
        if question not in self.questions():
            raise ValueError(f"{question!r} has no numbers of its own: the numeric questions "
                             f"are {', '.join(self.questions())}")
        numbers = getattr(self, question)
        names = [f.name for f in dataclasses.fields(numbers)]
        width = max(map(len, names))
        lines = [f"{question}, {self.learner}'s numbers:"]
        lines += [f"  {name:<{width}} = {_shown(getattr(numbers, name))}" for name in names]
        return "\n".join(lines)

    def show(self, question: str) -> None:
        """Print `question`'s numbers: what its text names, with this learner's values."""
        print(self.describe(question))


class LearnerError(ValueError):
    """The notebook does not say whose it is, or says two different things."""


def learner_id(learner: str = "") -> str:
    """Who the notebook is for: `learner` (the notebook's LEARNER), or JupyterHub's user when it
    is empty. Spaces around the id do not count."""
    if not isinstance(learner, str):
        raise LearnerError(f'LEARNER must be your id in quotes, such as LEARNER = "ada", not a '
                           f"{type(learner).__name__}.")
    written, hub = learner.strip(), os.environ.get(HUB_USER, "").strip()
    if written and hub and written != hub:
        raise LearnerError(
            f'LEARNER = "{written}", but you are signed in to JupyterHub as "{hub}". Each learner '
            "has numbers of their own, and the grader uses those of the id a notebook is handed "
            f'in under: set LEARNER = "" (or "{hub}") and run the notebook again.')
    if not (written or hub):
        raise LearnerError(
            'Write your student id in the cell above, LEARNER = "<your id>", exactly as the '
            "course knows you (the id you hand the quiz in under), and run it again. Each "
            "learner's numeric questions have numbers of their own, drawn from that id, and the "
            "grader checks your answers against the numbers of the id you hand in under. On "
            "JupyterHub, leave it empty: your hub user is used.")
    return written or hub


def draw(learner: str) -> Variant:
    """`learner`'s numbers, from the id alone (the environment plays no part)."""
    learner = learner.strip()
    if not learner:
        raise LearnerError("no learner id to draw numbers from")
    drawn = {question: kind(**{f.name: _pick(learner, question, f.name, f.metadata["choices"])
                               for f in dataclasses.fields(kind)})
             for question, kind in Variant.questions().items()}
    return Variant(learner, **drawn)


def variant(learner: str = "") -> Variant:
    """The numbers of the notebook's learner: `learner`, or JupyterHub's user (learner_id)."""
    return draw(learner_id(learner))


def _pick(learner: str, question: str, name: str, options: tuple):
    key = "\0".join((SALT, learner, question, name)).encode()
    return options[int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % len(options)]


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)
