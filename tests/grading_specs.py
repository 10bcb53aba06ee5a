"""What grading each graded notebook end to end must show: one spec per assignment, read by
tests/grading_checks.py (the batches, a tests/test_grading_<notebook>.py each) and by the
checkers' tests (the known mistakes, in process).

    LAB3.assignment.points            {"test_ring_all_reduce": 6, ...}: the ASSIGNMENT table
    LAB3.mistakes                     every known mistake: a string replacement in an answer cell
    LAB3.expect_checker_teaches(m)    its test cell, run here, fails with m's teaching message

A spec holds only what is particular to its notebook; the points come from the assignment's
table in gpulab/checks (never a copy) and the hostile cases from tests/hostile (cases_for, by
their `lab` field). Every known mistake loses its points in some test:
  - the labs' and the quiz's, each run through its checker by the checker tests
    (tests/test_checks_lab*.py, tests/test_quiz.py: one parametrized test over `mistakes`);
  - those named in `end_to_end`, graded by the batch as well: enough to show, through nbgrader
    and the sandbox, that a mistake costs exactly its part and that the feedback teaches it.
    Mistakes in distinct parts go in one notebook (`together`), one kernel for all of them; the
    capstone grades one such learner, with a mistake in Parts 4 and 5, and its other mistakes
    in the checker tests only (each of its checks is a cluster run, as the batch's are).
Not a test module (no `test_` prefix).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from hostile.cases import LAB3_ORPHAN_MARKER
from lab_submissions import Lab, Mistake, cell_by_grade_id, run_in_process

import gpulab.checks
from gpulab.checks.keys import all_answers
from gpulab.quiz import Pick, choose
from gpulab.stubs import STUB_HINT


@dataclass(frozen=True)
class Spec:
    """One graded notebook, as its end-to-end grading and its checkers' tests see it."""

    name: str  # the assignment: solutions/<name>/<name>.ipynb, released to labs/<name>/
    mistakes: tuple[Mistake, ...]  # every known mistake, each run through its checker
    # Student ids of the mistakes the batch also grades, in distinct parts: handed in as one
    # notebook, by the learner `together` (one kernel for all of them). None: the checker tests
    # carry every mistake, where a notebook's full run costs more than it shows.
    end_to_end: tuple[str, ...]
    together: str | None
    hidden_at_least: int = 1  # lines of hidden tests the notebook has, at least
    stub_hint: str = STUB_HINT  # what an unfinished stub's test says to do
    # test grade_id -> what its error says in the untouched release, where it is no stub's
    untouched_says: dict[str, str] = field(default_factory=dict)
    context: tuple[str, ...] = ()  # ids of ungraded cells the answers use (run_in_process)
    # The checker tests that run every mistake in process; None: all are graded end to end.
    checker_tests: str | None = None
    # What the processes some submissions start on purpose carry: none may outlive grading.
    leftover_marker: str | None = None
    extra: Callable[[Path], None] | None = None  # hands in more learners: extra(folder)
    marks: tuple = ()  # pytest marks of everything that grades this notebook

    @property
    def lab(self) -> Lab:
        return Lab(self.name)

    @property
    def short(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def assignment(self):
        return gpulab.checks.assignment(self.name)

    @property
    def manual(self) -> dict[str, None]:
        """The cells a person grades: autograding gives them no score."""
        return dict.fromkeys(grade_id for grade_id, _ in self.assignment.manual)

    def mistake(self, student_id: str) -> Mistake:
        (found,) = [m for m in self.mistakes if m.student_id == student_id]
        return found

    def graded_mistakes(self) -> dict[str, tuple[Mistake, ...]]:
        """Learner -> the mistakes in the notebook they hand in, for the end-to-end batch."""
        if not self.end_to_end:
            return {}
        return {self.together: tuple(self.mistake(m) for m in self.end_to_end)}

    def with_mistakes(self, mistakes) -> nbformat.NotebookNode:
        nb = self.lab.solution()
        for mistake in mistakes:
            nb = self.lab.with_mistake(mistake, nb)
        return nb

    def expect_checker_teaches(self, mistake: Mistake) -> None:
        """The solution with `mistake`, run in this process up to its test cell: that cell (its
        visible and hidden tests) fails with the mistake's teaching message."""
        error = run_in_process(self.lab.with_mistake(mistake), mistake.test, self.context)
        assert error is not None, f"{mistake.student_id}: {mistake.test} passed"
        assert re.search(mistake.teaching, str(error), re.S), str(error)


def params(specs, marks=()) -> list:
    """Each spec as a pytest parameter, with its marks and its short name as id."""
    return [pytest.param(spec, marks=(*spec.marks, *marks), id=spec.short) for spec in specs]


# ----------------------------------------------------------------------------- Lab 1

LAB1 = Spec(
    "lab1_cuda_kernels",
    mistakes=(
        # Values: each fails its part's value test; its technique test, run on the same kernel,
        # may pass or fail (a kernel that is wrong is not graded on how it is wrong).
        Mistake("off_by_one", "saxpy", "while i < out.size:", "while i <= out.size:",
                "test_saxpy", r"strictly less: the last valid index is n - 1"),
        Mistake("tile_row_stored", "transpose", "out[y + j, x] = tile[tx, (r + tx) % TILE_DIM]",
                "out[y + j, x] = tile[r, (tx + r) % TILE_DIM]", "test_transpose",
                r"Within a tile the elements are in the wrong places: a thread writes to out's "
                r"row the tile's column"),
        Mistake("skew_forgotten_on_read", "transpose", "tile[tx, (r + tx) % TILE_DIM]",
                "tile[tx, r]  # read back as if the tile were not skewed", "test_transpose",
                r"it reads each element from where it was written"),
        Mistake("no_barrier", "block_sum",
                "        cuda.syncthreads()  # every thread, every step: the next step reads "
                "these sums\n", "", "test_block_sum",
                # The simulator may or may not show this on the visible sizes; the hidden race
                # detector always does, so either message is right.
                r"a missing cuda\.syncthreads\(\)|block_sum: data race"),
        Mistake("one_per_thread", "block_sum", "    for k in range(ITEMS_PER_THREAD):",
                "    for k in range(1):  # one element per thread, as in lesson 02",
                "test_block_sum",
                r"That is the sum of the block's first 64 elements only: each thread adds 4"),
        Mistake("wrong_tile", "matmul_tiled",
                "a_row, k = cuda.blockIdx.y * TILE + r, t * TILE + tx",
                "a_row, k = cuda.blockIdx.y * TILE + r, tx  # the step t forgotten",
                "test_matmul_tiled", r"Check which tiles each step along K loads"),
        Mistake("one_output", "matmul_tiled", "        if row + half < m:\n"
                "            c[row + half, col] = acc_bottom + bias[col]\n", "",
                "test_matmul_tiled", r"of c's \d+ rows were never written: a block has 4 rows of "
                r"threads for a tile of 8 rows of c, so each thread computes 2 outputs"),
        Mistake("no_atomics", "histogram", "cuda.atomic.add(local, b, 1)", "local[b] += 1",
                "test_histogram",
                # Lost counts are likely, not certain, on the simulator: the race detector is.
                r"Counts were lost\. .* use cuda\.atomic\.add|is a read, an add and a write"),
        Mistake("no_left_halo", "stencil", "tile[t] = x[j] if 0 <= j < x.size else 0.0",
                "tile[t] = 0.0  # the left halo left out", "test_stencil",
                r"Only outputs within RADIUS of a block's edge are wrong: the halo"),
        Mistake("exclusive_scan", "block_scan", "out[i] = cache[t]\n",
                "out[i] = cache[t] - x[i]\n", "test_block_scan",
                r"That is the exclusive scan"),
        Mistake("best_by_habit", "waves",
                "threads_per_block = min(range(32, 1025, 32), key=lambda tpb: plan(tpb)[2])",
                "threads_per_block = 256  # the usual choice", "test_waves",
                r"Your plan's numbers are right, and it runs 14 waves; some block sizes run it "
                r"in 13"),
        # Technique: the right values the slow way. Each keeps its value points and loses its
        # technique's, with the number that shows why.
        Mistake("serial_block_sum", "block_sum",
                "    stride = THREADS // 2\n"
                "    while stride > 0:  # halve the active threads each step\n"
                "        if t < stride:\n"
                "            partial[t] += partial[t + stride]\n"
                "        cuda.syncthreads()  # every thread, every step: the next step reads "
                "these sums\n"
                "        stride //= 2\n"
                "    if t == 0:\n"
                "        out[cuda.blockIdx.x] = partial[0]\n",
                "    if t == 0:  # thread 0 adds the block alone\n"
                "        total = float32(0.0)\n"
                "        for j in range(THREADS):\n"
                "            total += partial[j]\n"
                "        out[cuda.blockIdx.x] = total\n",
                "test_block_sum_technique",
                r"Combine the threads' sums as a tree.*thread 0 of block 0 read 68 elements, one "
                r"by one"),
        Mistake("strided_loads", "block_sum", "i = start + k * THREADS + t",
                "i = start + t * ITEMS_PER_THREAD + k  # each thread a run of its own",
                "test_block_sum_technique",
                r"Let neighbouring threads load neighbouring elements: .*16\.0 sectors of 32 B "
                r"per warp request, where coalesced loads take 4"),
        Mistake("padded_tile", "transpose",
                "cuda.shared.array((TILE_DIM, TILE_DIM), float32)",
                "cuda.shared.array((TILE_DIM, TILE_DIM + 1), float32)", "test_transpose_technique",
                r"Keep the tile at TILE_DIM x TILE_DIM floats, no padding: .*declares 4224 B"),
        Mistake("naive_matmul", "matmul_tiled",
                "    acc_bottom = float32(0.0)\n"
                "    for t in range((k_dim + TILE - 1) // TILE):\n",
                "    acc_bottom = float32(0.0)\n"
                "    if col < n:  # every operand from global memory\n"
                "        for kk in range(k_dim):\n"
                "            if row < m:\n"
                "                acc_top += a[row, kk] * b[kk, col]\n"
                "            if row + half < m:\n"
                "                acc_bottom += a[row + half, kk] * b[kk, col]\n"
                "    for t in range(0):  # the tiles never loaded\n",
                "test_matmul_tiled_technique",
                r"Stage each TILE x TILE tile of `a` in shared memory.*reads 8\.0x the global "
                r"bytes of `a`"),
        Mistake("global_atomics", "histogram", "cuda.atomic.add(local, b, 1)",
                "cuda.atomic.add(counts, b, 1)", "test_histogram_technique",
                r"Count into a shared-memory copy of the bins.*made \d+ global atomic adds for "
                r"512 values"),
        Mistake("global_taps", "stencil", "total += w[j] * tile[t + j]",
                "k = i + j - RADIUS  # every tap from global memory\n"
                "            total += w[j] * (x[k] if 0 <= k < x.size else float32(0.0))",
                "test_stencil_technique",
                r"Load each block's x, with a halo of RADIUS on each side, into shared memory "
                r"once.*every thread reads its 7 taps from global"),
        Mistake("serial_scan", "block_scan",
                "    offset = 1\n"
                "    while offset < SCAN_THREADS:\n",
                "    if t == 0:  # thread 0 walks the block\n"
                "        for j in range(1, SCAN_THREADS):\n"
                "            cache[j] += cache[j - 1]\n"
                "    cuda.syncthreads()\n"
                "    offset = SCAN_THREADS  # no parallel steps\n"
                "    while offset < SCAN_THREADS:\n",
                "test_block_scan_technique",
                r"Scan in log2\(THREADS\) steps.*thread 0 of block 0 read \d+ elements, one by "
                r"one"),
    ),
    # One notebook, a mistake in each kernel and in the launch plan: values wrong in four,
    # the right values the slow way in four. The others are carried by the checkers' tests.
    end_to_end=("off_by_one", "padded_tile", "strided_loads", "naive_matmul", "no_atomics",
                "global_taps", "exclusive_scan", "best_by_habit"),
    together="eight_mistakes",
    hidden_at_least=8,
    context=("cell-31",),  # Part 6's worked example: the plan uses its math and get_gpu imports
    stub_hint="Replace `raise NotImplementedError()` with your kernel's code.",
    # Part 6's answers are still None: its checker asks for numbers.
    untouched_says={"test_waves": "should be a number"},
    checker_tests="tests/test_checks_lab1.py",
    marks=(pytest.mark.lab1,),
)

# ----------------------------------------------------------------------------- Lab 2

LAB2 = Spec(
    "lab2_amp_training",
    mistakes=(
        # The six bugs planted in the release's starting code, each left in alone.
        Mistake("blocking_copy", "to_device", "batch.to(device, non_blocking=True)",
                "batch.to(device)", "test_to_device",
                r"2 of 2 tensor copies were not asynchronous: call \.to\(device, "
                r"non_blocking=True\)"),
        Mistake("backward_in_autocast", "amp_step",
                "    scaler.scale(loss).backward()  # outside autocast: backward follows the "
                "forward's dtypes\n", "        scaler.scale(loss).backward()\n", "test_amp_step",
                r"backward ran inside torch\.autocast \(1 of 1 backward calls\)"),
        Mistake("clip_before_unscale", "amp_step",
                "        scaler.unscale_(optimizer)  # the true gradients, not S times them\n",
                "", "test_amp_step",
                r"about 1024 times too small \(max \|dw\| = .*clipped while still multiplied "
                r"by the scale S = 1024.*Call scaler\.unscale_\(optimizer\) before "
                r"clip_grad_norm_"),
        Mistake("count_weighted_loss", "accumulate_gradients",
                " * (len(x) / n_total)  # this micro-batch's share", " / len(micro_batches)",
                "test_accumulate_gradients",
                r"divided by the number of micro-batches \(3\), so each counts 1/3, while their "
                r"shares of the 28 examples are 16/28, 8/28, 4/28"),
        Mistake("scaler_not_restored", "resume", '    scaler.load_state_dict(snap["scaler"])\n',
                "", "test_resume",
                r"the GradScaler was not restored: scale 1024\.0, growth tracker 0; at the "
                r"snapshot they were 2048\.0 and 1 \(the snapshot holds the GradScaler's "
                r"state, but restore did not load it\)"),
        Mistake("shuffled_x", "memorize", "amp_step(model, optimizer, scaler, x, y, recipe)",
                "amp_step(model, optimizer, scaler, x[torch.randperm(len(x))], y, recipe)",
                "test_memorize", r"The memorization test fails: the weights moved .*x and y no "
                r"longer paired"),
        # Wrong fixes a learner may write on the way.
        Mistake("step_without_update", "amp_step",
                "    scaler.update()  # halve the scale after a skip, grow it after a run of "
                "clean steps\n", "", "test_amp_step",
                r"the scale is still 1024 after the step, expected 2048: scaler\.update\(\) was "
                r"not called"),
        Mistake("undivided_loss", "accumulate_gradients",
                " * (len(x) / n_total)  # this micro-batch's share", "",
                "test_accumulate_gradients",
                r"the sum of the micro-batches' mean gradients, about 3 times the batch's"),
        Mistake("forgotten_optimizer_state", "resume",
                '    optimizer.load_state_dict(snap["optimizer"])\n', "", "test_resume",
                r"the optimizer's state was not restored\. AdamW keeps"),
    ),
    # One notebook with a planted bug left in each of four parts (to_device left right); the
    # untouched release holds all six, and the checker tests carry each alone.
    end_to_end=("clip_before_unscale", "count_weighted_loss", "scaler_not_restored",
                "shuffled_x"),
    together="four_planted_bugs",
    hidden_at_least=8,
    # The release is the buggy loop, not stubs: each part fails on the first bug its checker
    # meets (amp_step's backward inside autocast, on the case without a GradScaler).
    untouched_says={
        "test_to_device": "tensor copies were not asynchronous",
        "test_amp_step": "backward ran inside torch.autocast",
        "test_accumulate_gradients": "divided by the number of micro-batches (3)",
        "test_resume": "(the snapshot holds no GradScaler state)",
        "test_memorize": "x and y no longer paired",
    },
    checker_tests="tests/test_checks_lab2.py",
    marks=(pytest.mark.lab2,),
)

# ----------------------------------------------------------------------------- Lab 3

# SimpleDDP's rule for parameters without a gradient: one all-reduce of used-flags first.
LAB3_USED_FLAGS = (
    "        params = [p for p in self.module.parameters() if p.requires_grad]  # frozen: left "
    "alone\n        if not params:\n            return\n"
    "        # Which parameters got a gradient on some rank: the flags' sum over the ranks.\n"
    "        used = torch.tensor([float(p.grad is not None) for p in params], "
    "device=params[0].device)\n        dist.all_reduce(used)\n"
    "        world_size = dist.get_world_size()\n"
    "        for p, users in zip(params, used.tolist()):\n"
    "            if users == 0:\n"
    "                continue  # no rank used it: None everywhere, so the optimizer skips it\n")

LAB3 = Spec(
    "lab3_ddp_from_scratch",
    mistakes=(
        Mistake("blocking_sends", "ring_all_reduce",
                "        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, "
                "recv, left)]\n        for request in dist.batch_isend_irecv(ops):\n"
                "            request.wait()\n",
                "        dist.send(send, right)\n        dist.recv(recv, left)\n",
                "test_ring_all_reduce",
                # 20 s in the lab; the checkers' tests shorten the wait.
                r"did not finish within \d+ s.*waiting in send to rank 1.*deadlocks: gloo's "
                r"send waits until the neighbour posts the matching receive"),
        # The right sums, each chunk cut in two messages: only the ring's traffic tells.
        Mistake("chunks_in_halves", "ring_all_reduce",
                "        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, "
                "recv, left)]\n        for request in dist.batch_isend_irecv(ops):\n"
                "            request.wait()\n",
                "        for out, into in zip(send.tensor_split(2), recv.tensor_split(2)):\n"
                "            ops = [dist.P2POp(dist.isend, out, right), "
                "dist.P2POp(dist.irecv, into, left)]\n"
                "            for request in dist.batch_isend_irecv(ops):\n"
                "                request.wait()\n",
                "test_ring_all_reduce",
                r"the right result, but rank 0 sent \d+ elements in 4 messages.*more than a "
                r"ring's 2 \(p - 1\) = 2\. Every message pays a fixed latency"),
        Mistake("undivided", "simple_ddp",
                "            p.grad /= world_size  # the mean: the whole batch's gradient\n", "",
                "test_simple_ddp",
                r"step 0, rank 0: the gradients are 2 times too big: they are the sum over the "
                r"ranks\. Divide by the world size \(2\)"),
        Mistake("no_overlap", "fast_ddp", "        self._launch_in_order(backward_done=False)\n",
                "", "test_fast_ddp",
                r"step 0: every bucket was all-reduced in finish_gradient_sync, after backward "
                r"had finished: nothing overlapped\. Launch each bucket from a gradient hook"),
        Mistake("same_order_every_epoch", "train_ddp",
                "        sampler.set_epoch(epoch)  # a new order each epoch, the same on every "
                "rank\n", "", "test_train_ddp",
                r"Every epoch went through the data in the same order: call "
                r"sampler\.set_epoch\(epoch\)"),
        # Torch DDP's rules for real models (frozen, unused, dtypes, devices), broken one each.
        Mistake("frozen_gets_zeros", "simple_ddp", LAB3_USED_FLAGS,
                "        world_size = dist.get_world_size()\n"
                "        for p in self.module.parameters():\n", "test_simple_ddp",
                r"frozen\.weight is frozen \(requires_grad=False\), yet it has a gradient"),
        Mistake("unused_gets_zeros", "simple_ddp", LAB3_USED_FLAGS,
                "        world_size = dist.get_world_size()\n"
                "        for p in self.module.parameters():\n"
                "            if not p.requires_grad:\n                continue\n",
                "test_simple_ddp",
                r"unused\.weight has a gradient after finish_gradient_sync, but no rank used it"
                r".*AdamW's weight decay still moves the weight"),
        Mistake("one_buffer_for_all_dtypes", "fast_ddp",
                ", bucket_bytes,\n                              [(p.dtype, p.device) for p in "
                "self.params])", ", bucket_bytes)", "test_fast_ddp",
                r"all-reduced tensors of \[175, 96, 256\] elements; the buckets hold \[170, 85, "
                r"16, 256\].*A bucket is one flat tensor of one dtype"),
        Mistake("buffers_without_device", "fast_ddp",
                ", dtype=bucket[0].dtype,\n                                    "
                "device=bucket[0].device)", ", dtype=bucket[0].dtype)", "test_fast_ddp",
                r"Rank \d sent a tensor on the device 'meta'.*Create every tensor the wrapper "
                r"sends on its parameters' device"),
        # Each rank updates its own slice and never hands it on: the ranks drift apart.
        Mistake("no_gather", "sharded_adamw",
                "        dist.all_gather_into_tensor(whole, self.shard.detach())\n",
                "        whole = F.pad(torch.cat([p.detach().reshape(-1) for p in self.params]), "
                "(0, padding))\n"
                "        whole[dist.get_rank() * self.size:][:self.size] = self.shard.detach()\n",
                "test_sharded_adamw",
                r"after step 0, rank 1 and rank 0 hold different parameters .*step\(\) gathered "
                r"nothing: each rank updated its own shard"),
    ),
    # Wrappers broken at once: each part fails at its first launch, the ring is left right.
    # Cheaper than any one of them alone, whose notebook runs three parts in full. The rules
    # for real models (frozen, unused, dtypes, devices) and the sharded optimizer's other
    # mistakes are carried by the checkers' tests (test_checks_lab3*.py).
    end_to_end=("undivided", "no_overlap", "same_order_every_epoch", "no_gather"),
    together="four_mistakes",
    hidden_at_least=5,
    leftover_marker=LAB3_ORPHAN_MARKER,  # the hostile bank's lab3_orphans ring
    checker_tests="tests/test_checks_lab3.py",
    marks=(pytest.mark.lab3, pytest.mark.dist),
)

# ----------------------------------------------------------------------------- Lab 4

LAB4 = Spec(
    "lab4_memory_and_profiling",
    mistakes=(
        Mistake("share_in_percent", "diagnosis",
                "DOMINANT_SHARE = sizes[DOMINANT_CATEGORY] / peak.total",
                "DOMINANT_SHARE = 100 * sizes[DOMINANT_CATEGORY] / peak.total",
                "test_diagnosis", r"not a percentage"),
        Mistake("undivided_loss", "fit_step", " * (len(x_micro) / n_total)", "",
                "test_fit_step", r"4 times the batch's gradient"),
        Mistake("syncs_per_micro_batch", "profile_reading", "SYNCS_PER_STEP = transfers.syncs\n",
                "SYNCS_PER_STEP = transfers.syncs / 8  # 8 micro-batches a step\n",
                "test_profile_reading", r"SYNCS_PER_STEP = 4, expected 32 .* per micro-batch"),
        # A wrong fast_train fails all three of its tests: the technique and the speed-up count
        # only for the same results.
        Mistake("scaled_not_standardized", "fast_train",
                "x_all = (v - v.mean(1, keepdim=True)) / v.std(1, correction=0, keepdim=True)",
                "x_all = v", "test_fast_results",
                r"The transform differs: the images were scaled to \[0, 1\] \(pixel / 16\) but "
                r"not standardized", also_fails=("test_fast_technique", "test_speedup")),
        # Right and fast on a CPU, where a sync has nothing to wait for: only the count tells.
        Mistake("item_every_step", "fast_train",
                "        losses.append(loss.detach())  # stays a tensor: no sync\n"
                "    return torch.stack(losses).tolist()  # one sync, at the end",
                "        losses.append(loss.item())  # read every step\n    return losses",
                "test_fast_technique", r"fast_train made 1\.00 host-device syncs a step"),
        # Fast enough on a CPU, where a pass of 8 examples costs little more per example.
        Mistake("micro_batches_kept", "fast_train",
                "        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])  # one batch, its "
                "mean loss\n",
                "        loss = sum(F.cross_entropy(model(x_all[i]), y_all[i])"
                " * (len(i) / batch_size)\n"
                "                   for i in idx.split(8))  # slow_train's micro-batches\n",
                "test_fast_technique",
                r"fast_train ran the model 8\.00 times a step \(slow_train 8\): micro-batches"),
        Mistake("slow_train_renamed", "fast_train", "    model.train()\n",
                "    return slow_train(model, optimizer, images, labels, steps=steps,\n"
                "                      batch_size=batch_size, seed=seed)\n", "test_speedup",
                r"fast_train is [\d.]+x as fast as slow_train; it must be at least 3x",
                also_fails=("test_fast_technique",)),
    ),
    # fit_step left right
    end_to_end=("share_in_percent", "syncs_per_micro_batch", "scaled_not_standardized"),
    together="three_mistakes",
    hidden_at_least=6,
    # The OOM scenario and its measured step (Part A1's answers read `measured`), the slow
    # pipeline's imports (fast_train calls example_order; the wrong one calls slow_train) and
    # its profile (Part B1's answers read `profile` and `transfers`).
    context=("806356e7", "8f9c99fa", "8c95df90", "e977d580"),
    checker_tests="tests/test_checks_lab4.py",
    marks=(pytest.mark.lab4,),
)

# ----------------------------------------------------------------------------- Lab 5

LAB5 = Spec(
    "lab5_parallelism_across_nodes",
    mistakes=(
        # Part 4 runs the learner's 1F1B order: a wrong order costs it too.
        Mistake("warmup_one_too_many", "one_f_one_b", "warmup = min(p - stage - 1, m)",
                "warmup = min(p - stage, m)", "test_one_f_one_b",
                r"Its warm-up is 4 forwards, too many: then stage 0 holds 5 microbatches at "
                r"once", also_fails=("test_pp_tp_cluster",)),
        Mistake("mlp_left_whole", "pp_tp_step",
                "        block.ff = TPMLP(block.ff, groups.tp)  # this rank's half of each MLP\n",
                "        pass\n", "test_pp_tp_cluster",
                r"blocks\.0\.ff is a FeedForward, not your TPMLP: replace each Block's MLP"),
        Mistake("image_too_new", "cloud_job", "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime",
                "pytorch/pytorch:2.6.0-cuda12.6-cudnn9-runtime", "test_cloud_job",
                r"Use an image built for CUDA 12\.4 or older: .* needs CUDA 12\.6, newer than "
                r"the VMs' driver runs"),
        Mistake("checkpoints_hours_apart", "cloud_job", "str(round(60 * every))", '"240"',
                "test_cloud_job",
                r"Checkpoint at most every 90 minutes: every 240 loses .* = 11\.2% of the time"),
        # Right output and right shard gradients: only what every rank holds whole is partial.
        Mistake("norm_grads_unsynced", "sp_block",
                "            dist.all_reduce(p.grad, group=self.group)\n", "            pass\n",
                "test_sp_block", r"the gradient of ln_1\.weight \(ln_1\.weight\) is this rank's "
                r"part only .* sync_replicated_grads\(\) must all-reduce"),
        # Valid and within the memory bound: only the simulator's bubble shows it.
        Mistake("same_warmup_on_every_device", "interleaved",
                "warmup = min(2 * (p - stage - 1) + (v - 1) * p, total)",
                "warmup = min((v - 1) * p, total)", "test_interleaved",
                r"leaves a bubble of 0\.692 of the stage-time idle; the bound is 0\.158"),
    ),
    # Parts 5, 6 and 7's mistakes ride with Part 4's: one notebook, one cluster run.
    end_to_end=("mlp_left_whole", "image_too_new", "norm_grads_unsynced",
                "same_warmup_on_every_device"),
    together="four_mistakes",
    hidden_at_least=5,
    # `import copy`, the pipeline's pieces (split_gpt, PipelineStage, run_pipeline) and JobSpec,
    # and Part 5's cost functions, which the answers use.
    context=("f8f60780", "bc9ed312", "part5-given"),
    checker_tests="tests/test_checks_lab5.py",
    marks=(pytest.mark.lab5, pytest.mark.dist),
)

# ----------------------------------------------------------------------------- the quiz

QUIZ_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
CLICKED_ONLY = "q07"  # the question the "clicked_only" learner answered with a click alone
QUIZ_CHOICE = gpulab.checks.package("quiz").CHOICE
QUIZ_NUMERIC = tuple(gpulab.checks.package("quiz").ANSWERS)  # each learner's numbers differ
# Two learners who hand in each other's answers, written down as numbers: learner -> whose.
SWAPPED = {"ada": "grace", "grace": "ada"}


def solution_region(cell) -> str:
    return cell.source.split("### BEGIN SOLUTION\n")[1].split("\n### END SOLUTION")[0]


def picked_and_written(clicked_only: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """The quiz's release as a learner hands it in after answering every question right: for a
    choice, clicked in the buttons (headless here) and the line they showed written into the
    answer cell; for a number, the solution's code. Questions in `clicked_only` were clicked,
    and the click is recorded in the saved notebook (the buttons' output), but their line never
    written: their answer cells still hold the stub."""
    quiz = Lab("quiz")
    solution, nb = quiz.solution(), quiz.released()
    for qid in QUIZ.assignment.points:
        cell = cell_by_grade_id(nb, f"{qid}_answer")
        right = solution_region(cell_by_grade_id(solution, f"{qid}_answer"))
        assert QUIZ_STUB in cell.source, f"{qid}: the release's answer cell changed"
        if qid not in QUIZ_CHOICE:
            cell.source = cell.source.replace(QUIZ_STUB, right)
            continue
        letter = re.fullmatch(rf'{qid} = "([a-d])"', right).group(1)
        choices = cell_by_grade_id(solution, f"{qid}_choices")
        call = ast.parse(choices.source).body[0].value  # choose("q07", {...})
        options = ast.literal_eval(call.args[1])
        namespace = {}
        picker = choose(qid, options, namespace, interactive=False)
        line = picker.pick(letter)  # what the click shows
        assert isinstance(namespace[qid], Pick)
        shown = cell_by_grade_id(nb, f"{qid}_choices")
        shown.outputs = [nbformat.v4.new_output(
            "execute_result", data={"text/plain": picker.text()}, execution_count=1)]
        if qid not in clicked_only:
            cell.source = cell.source.replace(QUIZ_STUB, line)
    return nb


def patched_grader() -> nbformat.NotebookNode:
    """The solution with q05 answered wrong, and the function that grades picks replaced by one
    that passes everything, where the quiz's test cells import it from."""
    nb = Lab("quiz").solution()
    answer = cell_by_grade_id(nb, "q05_answer")
    answer.source = answer.source.replace(
        'q05 = "c"', 'q05 = "a"\nimport gpulab.checks.quiz\n\ngpulab.checks.quiz.grade_pick = '
                     'lambda *args, **kwargs: None  # every pick is right')
    return nb


def numbers_written_down(learner: str) -> nbformat.NotebookNode:
    """The solution with each numeric answer written down as `learner`'s number (`q02 =
    134.23`), as their notebook printed it, instead of the code that computes it: an answer
    sheet another learner could copy. LEARNER stays empty, as a copier would leave it."""
    nb = Lab("quiz").solution()
    answers = all_answers("quiz", learner)
    for qid in QUIZ_NUMERIC:
        cell = cell_by_grade_id(nb, f"{qid}_answer")
        number = answers[f"quiz.{qid}"]
        cell.source = cell.source.replace(solution_region(cell), f"{qid} = {number!r}")
    return nb


def hand_in_quiz_learners(folder: Path) -> None:
    quiz = Lab("quiz")
    quiz.hand_in(folder, "picked_and_written", picked_and_written())
    quiz.hand_in(folder, "clicked_only", picked_and_written(clicked_only=(CLICKED_ONLY,)))
    quiz.hand_in(folder, "tampered", patched_grader())
    for student, whose in SWAPPED.items():
        quiz.hand_in(folder, student, numbers_written_down(whose))


QUIZ = Spec(
    "quiz",
    mistakes=(
        Mistake("wrong_pick", "q12_answer", 'q12 = "a"', 'q12 = "d"', "q12",
                r'q12: "d" is not the best choice\. Lesson 04, section 2 \(backends\) explains '
                r'it\.'),
        Mistake("everything_equal", "q01_answer", 'q01 = "b"',
                'class Anything(str):\n    def __eq__(self, other):\n        return True\n\n'
                '    __hash__ = str.__hash__\n\n\nq01 = Anything("a")', "q01",
                r'q01: "a" is not the best choice'),
        Mistake("bytes_not_gbps", "q13_answer", "latency) / 1e9", "latency)", "q13",
                r"q13 = [\d.e+]+ GB/s is not within 1% of the answer\. It is off by a factor "
                r"of 1e9: check that it is in GB/s, as the question asks\. Lesson 04, section 6 "
                r"\(the alpha-beta cost model of the ring all-reduce\) explains it\."),
        Mistake("chunks_forgotten", "q19_answer", "(1 - bound) / (bound * v)",
                "(1 - bound) / bound", "q19",
                r"q19 = \d+ microbatches is not exactly the answer\. That ignores n_chunks: it "
                r"is the count for plain 1F1B, one chunk per GPU\. Lesson 06, sections 5 and 6 "
                r"\(the bubble of interleaved 1F1B\) explains it\."),
        Mistake("zero3_not_zero2", "q15_answer", "per_param = 2 + (2 + 12) / mine.q15.world_size",
                "per_param = (2 + 2 + 12) / mine.q15.world_size", "q15",
                r"q15 = [\d.]+ billion parameters is not within 1% of the answer\. That shards "
                r"the weights too \(ZeRO-3\); ZeRO-2 keeps all the 16-bit weights on every "
                r"GPU\."),
        Mistake("number_as_text", "q14_answer",
                "q14 = links / ring_factor(mine.q14.other_world_size)", 'q14 = "140 GB/s"', "q14",
                r"q14 must be a number in GB/s \(such as q14 = 12\.5\), not a str"),
    ),
    # Independent questions: one notebook holds them all, a kernel per learner is the cost.
    end_to_end=("wrong_pick", "everything_equal", "bytes_not_gbps", "chunks_forgotten",
                "zero3_not_zero2", "number_as_text"),
    together="six_mistakes",
    hidden_at_least=50,  # two lines per question
    context=("learner",),  # LEARNER = "": the numbers are then the hub user's (the test's)
    extra=hand_in_quiz_learners,
    checker_tests="tests/test_quiz.py",
    marks=(pytest.mark.quiz,),
)

# ----------------------------------------------------------------------------- the capstone

CAPSTONE = Spec(
    "capstone_distributed_gpt",
    mistakes=(
        Mistake("unsharded_prediction", "predict_memory", "world_size=plan.dp_size)",
                "world_size=1)", "test_memory_plan",
                r"predict_memory says .*the measured peak is .*more than was there"),
        Mistake("optimizer_left_behind", "load_checkpoint",
                '    state = {"model": model_state, "optim": optim_state}\n'
                '    dcp.load(state, checkpoint_id=done[-1])\n'
                '    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
                '                   optim_state_dict=state["optim"])',
                '    state = {"model": model_state}\n'
                '    dcp.load(state, checkpoint_id=done[-1])\n'
                '    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
                '                   optim_state_dict=optim_state)',
                "test_elastic_resume",
                r"replayed after the resume, gave loss .*save and load the optimizer's state"),
        # Part 4: each of these stops at the first run, the notice's; one launch each.
        Mistake("saves_in_the_handler", "handle_notice",
                "    told = torch.tensor([1.0 if notice_came else 0.0])\n"
                "    dist.all_reduce(told, op=dist.ReduceOp.MAX)  # one node was told: every "
                "rank must save\n"
                "    if told.item():\n"
                "        save_checkpoint(folder, model, optimizer, step)\n"
                "        raise SystemExit(REQUEUE_EXIT_CODE)",
                "    # saves the moment the notice comes, this boundary's state, from the handler\n"
                "    signal.signal(signal.SIGTERM, lambda signum, frame: (\n"
                "        save_checkpoint(folder, model, optimizer, step),\n"
                "        sys.exit(REQUEUE_EXIT_CODE)))",
                "test_preemption",
                r"save_checkpoint was called inside the SIGTERM handler .*Let the handler only "
                r"note the notice"),
        Mistake("ignores_the_notice", "install_notice_handler",
                "    signal.signal(signal.SIGTERM, on_notice)",
                "    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nothing stops this run",
                "test_preemption",
                r"node 1 went on training after the notice: .* killed \(SIGKILL\), the grace "
                r"period being 30 s\. \d+ steps? lost: the first run had completed steps 0 to "),
        Mistake("no_emergency_checkpoint", "handle_notice",
                "        save_checkpoint(folder, model, optimizer, step)\n", "",
                "test_preemption",
                r"[12] steps? lost: the first run had completed steps 0 to [56], and the newest "
                r"complete checkpoint is step 4's, the periodic one"),
        Mistake("save_outlives_the_grace", "save_checkpoint", "    dcp.save(",
                "    import time\n\n"
                "    if step % 4:  # not a periodic one: the notice's, a full copy to slow disk\n"
                "        time.sleep(45)  # longer than the grace period\n"
                "    dcp.save(",
                "test_preemption",
                r"node 1 was killed mid-save: SIGKILL came [\d.]+ s after the notice \(the "
                r"grace period is 30 s\) while the checkpoint of step [56] was still being "
                r"written .*your completed saves took up to [\d.]+ s"),
        # Part 5: two planted hangs, a few seconds.
        Mistake("blames_the_first_rank", "diagnose_hang", "    return elsewhere[0], missing",
                "    return min(waiting), waiting[min(waiting)]  # the first rank listed",
                "test_hang_diagnosis",
                r"rank 0 is one of the ranks waiting in \w+: it made the call and waits for "
                r"the rank that never did"),
    ),
    # One learner graded end to end, with a mistake in each of Parts 4 and 5: the proof that
    # the notice's and the hang's failures cost exactly their parts through nbgrader. Every
    # capstone notebook runs seven 2 x 2 cluster launches and two planted hangs, minutes of CPU
    # beside the solution, so the other mistakes meet their checkers in process only
    # (tests/test_checks_capstone.py, one or two launches each).
    end_to_end=("no_emergency_checkpoint", "blames_the_first_rank"),
    together="two_mistakes",
    hidden_at_least=2,
    checker_tests="tests/test_checks_capstone.py",
    marks=(pytest.mark.capstone, pytest.mark.dist),
)

SPECS = (LAB1, LAB2, LAB3, LAB4, LAB5, QUIZ, CAPSTONE)
