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
question worth asking (tests/test_quiz_variants.py tries them all): the spot job's restarts
alone stay well under its loss bound, and one node's rate gives a clearly longer interval; the
ZeRO-2 job fits, and ZeRO-3 would need fewer GPUs; the pipeline's microbatches fill whole
rounds of the interleaved schedule, and its bubble is over 1% (so a percentage is not mistaken
for a fraction).
Taught in: the course quiz, solutions/quiz/quiz.ipynb.
"""

import dataclasses
import hashlib
import os
from dataclasses import dataclass

# A new salt draws new numbers for everyone (a new class); notebooks and grader must agree.
SALT = "gpulab quiz, edition 1"
HUB_USER = "JUPYTERHUB_USER"  # set by JupyterHub in each learner's server, and by the grader


def choices(*options):
    """A field drawn from `options` (dataclasses.field metadata, read by `draw`)."""
    return dataclasses.field(metadata={"choices": options})


@dataclass(frozen=True)
class RooflineBound:
    """q02: a bf16 LayerNorm over x of shape (rows, hidden), in one fused pass, on `gpu`."""

    gpu: str = choices("A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200", "L4", "MI300X")
    rows: int = choices(4096, 8192, 16384)
    hidden: int = choices(2048, 4096, 8192)


@dataclass(frozen=True)
class SpotCheckpoint:
    """q03: the longest checkpoint interval that holds a spot job's preemption loss to a bound."""

    nodes: int = choices(2, 3, 4)  # every node's preemption stops the whole job
    preemptions_per_node_hour: float = choices(0.01, 0.02, 0.03, 0.05)
    restart_minutes: int = choices(2, 3, 5)
    max_loss_percent: int = choices(3, 4, 5)  # of the running time


@dataclass(frozen=True)
class StridedLoad:
    """q04: a warp's 32 threads each load x[stride * i], elements of `dtype`."""

    stride: int = choices(2, 3, 4, 5, 6, 7)
    dtype: str = choices("float16", "float32")


@dataclass(frozen=True)
class RingAllReduce:
    """q13: the alpha-beta model's time for a ring all-reduce of n_bytes on world_size GPUs."""

    n_bytes: float = choices(0.5e9, 1e9, 2e9, 4e9)
    world_size: int = choices(4, 8, 16)
    alpha: float = choices(2e-6, 5e-6, 10e-6)  # seconds per message
    beta: float = choices(25e9, 50e9, 100e9, 200e9)  # bytes per second per link


@dataclass(frozen=True)
class BusBandwidth:
    """q14: the busbw nccl-tests prints for an all-reduce of n_bytes that took `seconds`."""

    n_bytes: float = choices(1e9, 2e9, 4e9)
    world_size: int = choices(4, 8, 16)
    seconds: float = choices(0.02, 0.05, 0.1)


@dataclass(frozen=True)
class Zero2WorldSize:
    """q15: the fewest `gpu`s on which ZeRO-2 holds a model's mixed-precision Adam states."""

    gpu: str = choices("A100 80GB SXM", "H100 SXM", "H100 PCIe")
    n_params: float = choices(10e9, 13e9, 16e9, 20e9)
    reserved_gb: int = choices(16, 24, 32)  # per GPU, for activations and buffers


@dataclass(frozen=True)
class InterleavedBubble:
    """q19: the bubble of interleaved 1F1B on pp_size GPUs, n_chunks model chunks each."""

    pp_size: int = choices(4, 8)
    batch: int = choices(32, 64, 128)  # sequences per step
    microbatch: int = choices(2, 4)  # sequences per microbatch
    n_chunks: int = choices(2, 4)


@dataclass(frozen=True)
class MasterlessStates:
    """q22: model states of a model cast to bf16, trained by `optimizer` with no master copy."""

    n_params: float = choices(1e9, 1.5e9, 3e9, 7e9, 8e9, 13e9)
    optimizer: str = choices("adamw", "sgd-momentum")  # gpulab.memory.recipes' names


@dataclass(frozen=True)
class Variant:
    """One learner's numbers, question by question (the numeric questions only)."""

    learner: str  # the id they were drawn from
    q02: RooflineBound
    q03: SpotCheckpoint
    q04: StridedLoad
    q13: RingAllReduce
    q14: BusBandwidth
    q15: Zero2WorldSize
    q19: InterleavedBubble
    q22: MasterlessStates

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
