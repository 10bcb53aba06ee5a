"""Lab 3's checkers pass the lab's own solution, run on real processes, and fail, with the message
that teaches, on the wrong versions learners write: a ring that averages, that sends or
receives the wrong chunk (a wrong sum, or gloo's abort when the chunks differ in size), that
skips the all-gather, that deadlocks, that leaves a transposed tensor untouched, that calls
dist.all_reduce or gpulab's ring, that gets the sums right by sending whole tensors or too
many messages; a wrapper that does not divide, does not broadcast,
averages the start, all-reduces only after backward, never waits, blocks in its hooks, launches
buckets out of order, broadcasts on rank 0 only; a training loop without set_epoch, without the
seed, without a DistributedSampler, with the global batch on every rank, without
finish_gradient_sync, or stepping before it.

The right code is the solution notebook's own answer cells, run in a fresh `__main__` (so that
it travels to the ranks by value, as a notebook's code does); each wrong version is the same
code with one change. Each check is one launch of 2 to 4 processes (about 2 s); the checks that
must hang run with a time limit of a few seconds.
"""

import re
import types

import pytest
import torch
from grading_specs import LAB3 as SPEC
from grading_specs import LAB3_USED_FLAGS as SPEC_FLAGS
from lab_submissions import Lab, cell_by_grade_id

from gpulab.checks.harness import owned
from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import learner_frames
from gpulab.checks.lab3 import (
    check_fast_ddp,
    check_make_buckets,
    check_ring_all_reduce,
    check_simple_ddp,
    check_train_ddp,
)
from gpulab.checks.lab3 import simple_ddp as lab3_ddp
from gpulab.checks.lab3.fast_ddp import reference_buckets
from gpulab.distributed import ring_all_reduce as gpulab_ring_all_reduce
from gpulab.models import MLP

pytestmark = [pytest.mark.dist, pytest.mark.lab3]

SOLUTION = Lab("lab3_ddp_from_scratch").solution()
CELL_FILE = "/tmp/ipykernel_0/cell.py"  # where a kernel's cells say they come from
HIDDEN_RING = {"world_sizes": (5,), "sizes": (1, 3, 12, 4097), "transposed": True,
               "dtype": torch.float64, "seed": 5}


def notebook(changes=(), extra: str = "") -> types.ModuleType:
    """The solution's imports and answer cells, run in a fresh module named __main__ (as a
    kernel runs them), with `changes`: (grade_id, old, new) replacements, each of a text found
    exactly once in that cell; then `extra`, code a learner adds."""
    sources = {gid: cell_by_grade_id(SOLUTION, gid).source
               for gid in ("imports", "ring_all_reduce", "simple_ddp", "fast_ddp", "train_ddp")}
    for gid, old, new in changes:
        assert sources[gid].count(old) == 1, f"{old!r} is not once in {gid}: update this test"
        sources[gid] = sources[gid].replace(old, new)
    module = types.ModuleType("__main__")
    for source in (*sources.values(), extra):
        exec(compile(source, CELL_FILE, "exec"), module.__dict__)
    return module


def fails(check, *args, match: str, **kwargs) -> str:
    with pytest.raises(AssertionError) as error:
        check(*args, **kwargs)
    assert re.search(match, str(error.value), re.S), str(error.value)
    return str(error.value)


@pytest.fixture
def quick_timeouts(monkeypatch):
    """Code that must hang is cut after 8 s here (20 s and 30 s in the lab): time enough, on a
    busy machine, for every rank to reach the call it hangs in."""
    from gpulab.checks.lab3 import fast_ddp, ring

    monkeypatch.setattr(ring, "RING_TIMEOUT_S", 8.0)
    monkeypatch.setattr(lab3_ddp, "DDP_TIMEOUT_S", 8.0)
    monkeypatch.setattr(fast_ddp, "DDP_TIMEOUT_S", 8.0)


# ----------------------------------------------------------------------------- Part 1


def test_the_solutions_ring_passes_the_visible_and_the_hidden_tests():
    ring = notebook().ring_all_reduce
    check_ring_all_reduce(ring, world_sizes=(2, 3), sizes=(7, 1000))
    check_ring_all_reduce(ring, **HIDDEN_RING)


EXCHANGE = ("        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, "
            "left)]\n        for request in dist.batch_isend_irecv(ops):\n"
            "            request.wait()\n")
ALL_GATHER = '''    for s in range(p - 1):  # all-gather: pass the finished chunks on, overwriting
        exchange(chunks[(rank - s + 1) % p], chunks[(rank - s) % p])
'''
WRONG_RINGS = {
    "averages": ([("ring_all_reduce", "    return tensor\n",
                   "    return tensor.div_(p) if op == 'sum' else tensor\n")], {},
                 r"rank 0 holds the mean over the 2 ranks, not the sum"),
    "no_all_gather": ([("ring_all_reduce", ALL_GATHER, "")], {},
                      r"rank 0's value alone\. Only chunk 1 is complete: the reduce-scatter works, "
                      r"and the all-gather is missing"),
    "adds_everything": ([("ring_all_reduce", "combine = torch.add if op == \"sum\" else "
                          "torch.maximum", "combine = torch.add")], {"sizes": (7,)},
                        r"op='max'.*holds the sum; for op='max', combine .* by torch\.maximum"),
    "wrong_chunk_sent": ([("ring_all_reduce", "exchange(chunks[(rank - s) % p], arrived)",
                           "exchange(chunks[(rank - s - 1) % p], arrived)")],
                         {"world_sizes": (3,), "sizes": (9,)},
                         r"on rank \d, element \d+ \(in chunk \d, elements \d\.\.\d\) is \d+, "
                         r"expected \d+.*Check which chunk each step sends and receives"),
    # On 5 ranks, with chunks of unequal sizes: a wrong index is a wrong sum when the chunks
    # it confuses are of one size, and gloo's abort when they are not.
    "wrong_chunk_received_5_ranks": (
        [("ring_all_reduce", "exchange(chunks[(rank - s + 1) % p], chunks[(rank - s) % p])",
          "exchange(chunks[(rank - s + 1) % p], chunks[(rank - s - 1) % p])")],
        {"world_sizes": (5,), "sizes": (15,), "ops": ("sum",)},
        r"n=15, op='sum' on 5 ranks\): on rank \d, element \d+ \(in chunk \d, elements "
        r"\d+\.\.\d+\) is \d+, expected \d+.*Check which chunk each step sends and receives"),
    "wrong_chunk_sent_uneven_chunks": (
        [("ring_all_reduce", "exchange(chunks[(rank - s) % p], arrived)",
          "exchange(chunks[(rank - s - 1) % p], arrived)")],
        {"world_sizes": (5,), "sizes": (13,), "ops": ("sum",)},
        r"\(5 ranks\) raised RuntimeError on rank \d in the case n=13.*gloo lost its connection"
        r".*most likely a chunk index.*Check each step's chunk indices"),
    "reshape_copies": ([("ring_all_reduce", "flat = tensor.contiguous().view(-1)",
                         "flat = tensor.reshape(-1)"),
                        ("ring_all_reduce", "    if not tensor.is_contiguous():  # flat was a "
                         "copy\n        tensor.copy_(flat.view_as(tensor))\n", "")],
                       {"sizes": (), "transposed": True},
                       r"the tensor passed in is unchanged on rank 0.*transposed view, not "
                       r"contiguous: tensor\.reshape\(-1\) and tensor\.flatten\(\) copy it"),
}


@pytest.mark.parametrize("name", WRONG_RINGS)
def test_a_wrong_ring_fails_with_its_message(name):
    changes, kwargs, match = WRONG_RINGS[name]
    fails(check_ring_all_reduce, notebook(changes).ring_all_reduce,
          **{"world_sizes": (2,), **kwargs}, match=match)


WHOLE_TENSOR_TO_EVERY_RANK = '''
def ring_all_reduce(tensor, op="sum"):
    p, rank = dist.get_world_size(), dist.get_rank()
    flat = tensor.contiguous().view(-1)
    combine = torch.add if op == "sum" else torch.maximum
    others = {peer: torch.empty_like(flat) for peer in range(p) if peer != rank}
    requests = []
    for peer, into in others.items():
        requests += [dist.isend(flat, peer), dist.irecv(into, peer)]
    for request in requests:
        request.wait()
    result = flat.clone()
    for into in others.values():
        combine(result, into, out=result)
    flat.copy_(result)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor
'''


def test_the_right_sum_from_whole_tensors_fails_with_its_traffic():
    """Every rank sends its whole tensor to every other: the right numbers, (p - 1) n elements
    a rank where a ring sends 2 (p - 1) ceil(n / p). On 2 ranks the two are equal, and pass."""
    naive = notebook(extra=WHOLE_TENSOR_TO_EVERY_RANK).ring_all_reduce
    check_ring_all_reduce(naive, world_sizes=(2,), sizes=(8,))
    fails(check_ring_all_reduce, naive, world_sizes=(3,), sizes=(1000,), ops=("sum",),
          match=r"n=1000, op='sum' on 3 ranks\) gives the right result, but rank 0 sent 2000 "
                r"elements in 2 messages \(the largest 1000\): that is the whole tensor, more "
                r"than once\. A ring sends at most 1336 elements per rank here")


def test_the_traffic_bound_is_the_rings_own():
    from gpulab.checks.lab3.ring import ring_traffic_bound

    assert ring_traffic_bound(1000, 3) == (4, 1336)  # chunks of 334, 333, 333
    assert ring_traffic_bound(7, 2) == (2, 8)
    assert ring_traffic_bound(1, 4) == (6, 6)  # one chunk of 1, three empty ones


def test_a_ring_of_blocking_sends_deadlocks_and_is_stopped_with_where_it_waited(quick_timeouts):
    ring = notebook([("ring_all_reduce", EXCHANGE, "        dist.send(send, right)\n"
                      "        dist.recv(recv, left)\n")]).ring_all_reduce
    text = fails(check_ring_all_reduce, ring, world_sizes=(3,),
                 match=r"did not finish within 8 s.*rank 0: waiting in send to rank 1.*"
                       r"deadlocks: gloo's send waits until the neighbour posts the matching "
                       r"receive.*batch_isend_irecv")
    assert "in your code" in text and CELL_FILE in text, "the learner's line is shown"


def test_a_rank_that_skips_its_part_is_stopped_and_named(quick_timeouts):
    ring = notebook(extra='''
_ring = ring_all_reduce


def ring_all_reduce(tensor, op="sum"):
    if dist.get_rank() == 1:
        return tensor  # skips the ring: its neighbours wait for its messages
    return _ring(tensor, op)
''').ring_all_reduce
    fails(check_ring_all_reduce, ring, world_sizes=(2,), sizes=(7,),
          match=r"did not finish within 8 s.*rank 0: running.*rank 1: finished.*A rank that "
                r"waits forever is waiting for a message its neighbour never sent")


def test_collectives_and_gpulabs_ring_earn_nothing():
    fails(check_ring_all_reduce, gpulab_ring_all_reduce, match=r"is gpulab's "
          r"gpulab\.distributed\.allreduce\.ring_all_reduce: write your own")
    uses = notebook(extra='''
def ring_all_reduce(tensor, op="sum"):
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor
''').ring_all_reduce
    fails(check_ring_all_reduce, uses, world_sizes=(2,), sizes=(7,),
          match=r"called dist\.all_reduce on rank 0: build the ring from point-to-point")
    wraps = notebook(extra='''
from gpulab.distributed import ring_all_reduce as library_ring


def ring_all_reduce(tensor, op="sum"):
    return library_ring(tensor)
''').ring_all_reduce
    fails(check_ring_all_reduce, wraps, world_sizes=(2,), sizes=(7,),
          match=r"ran gpulab's own code \(allreduce\.py: ring_all_reduce\) on rank 0")


def test_a_stub_says_what_to_replace():
    stub = notebook(extra="def ring_all_reduce(tensor, op='sum'):\n    raise "
                          "NotImplementedError()").ring_all_reduce
    fails(check_ring_all_reduce, stub, world_sizes=(2,), sizes=(7,),
          match=r"raised NotImplementedError on rank \d\nReplace `raise NotImplementedError\(\)`")


def test_learner_frames_keep_the_notebooks_lines_only():
    text = '''Traceback (most recent call last):
  File "/work/gpulab/checks/lab3_ranks.py", line 40, in ring_rank
    returned = ring_all_reduce(x, case["op"])
  File "/tmp/ipykernel_7/123.py", line 9, in ring_all_reduce
    dist.send(send, right)
  File "/x/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
RuntimeError: boom'''
    frames = learner_frames(text.replace("/work/gpulab", str(owned.LIBRARY_DIR)))
    assert frames == ('  File "/tmp/ipykernel_7/123.py", line 9, in ring_all_reduce\n'
                      "    dist.send(send, right)")


# ----------------------------------------------------------------------------- Part 2


def test_the_solutions_simple_ddp_passes_on_2_and_3_ranks():
    check_simple_ddp(notebook().SimpleDDP, world_sizes=(2, 3))


BROADCAST = ("        for p in module.parameters():  # every rank calls it: rank 0 sends, the "
             "others receive\n            dist.broadcast(p.data, src=0)\n")
WRONG_SIMPLE = {  # and SPEC's "undivided", below
    "no_broadcast": ([("simple_ddp", BROADCAST, "")],
                     r"rank 1 still holds its own random initial parameters.*dist\.broadcast\("
                     r"p\.data, src=0\)"),
    "averaged_start": ([("simple_ddp", BROADCAST, "        for p in module.parameters():\n"
                         "            dist.all_reduce(p.data)\n"
                         "            p.data /= dist.get_world_size()\n")],
                       r"start from the mean of their initial parameters: copy rank 0's"),
    "never_all_reduced": ([("simple_ddp", "            dist.all_reduce(p.grad)  # the sum over "
                            "the ranks\n", "")],
                          r"the gradients are this rank's own \(those of its shard alone"),
    # A parameter only rank 0 used goes on rank 0 alone: the ranks' all-reduces pair up wrong.
    "skips_missing": ([("simple_ddp", SPEC_FLAGS, "        world_size = dist.get_world_size()\n"
                        "        for p in self.module.parameters():\n"
                        "            if p.grad is None:\n                continue\n")],
                      r"The ranks' collectives differ: call \d+ is all_reduce of 80 elements in "
                      r"finish_gradient_sync on rank 0, but all_reduce of 256 elements.*it still "
                      r"goes on that rank, in its turn, with zeros"),
}


@pytest.mark.parametrize("name", WRONG_SIMPLE)
def test_a_wrong_simple_ddp_fails_with_its_message(name):
    changes, match = WRONG_SIMPLE[name]
    fails(check_simple_ddp, notebook(changes).SimpleDDP, match=match)


def test_borrowed_wrappers_earn_nothing():
    fails(require_own_class, MLP, "SimpleDDP", match=r"is \(or extends\) gpulab's "
          r"gpulab\.models\.MLP")
    fails(require_own_class, type("SimpleDDP", (torch.nn.parallel.DistributedDataParallel,), {}),
          "SimpleDDP", match=r"extends torch's DistributedDataParallel")
    fails(check_simple_ddp, lambda module: module, match=r"SimpleDDP is not a class")


# ----------------------------------------------------------------------------- Part 3


def test_the_solutions_fast_ddp_passes_the_visible_and_the_hidden_tests():
    nb = notebook()
    check_fast_ddp(nb.FastDDP, nb.make_buckets, world_size=2)
    check_fast_ddp(nb.FastDDP, nb.make_buckets, world_size=3,
                   cases=("uneven", "one_bucket", "unused", "unused_some"), seed=4)


def test_reference_buckets_follow_the_spec():
    mlp = [768, 64, 1024, 64, 320, 20]  # the MLP's parameters in bytes
    assert reference_buckets(mlp, 1200) == [[5, 4, 3], [2, 1], [0]]
    assert reference_buckets(mlp, 400) == [[5, 4], [3], [2], [1], [0]]
    assert reference_buckets([12, 200, 12, 12], 40) == [[3, 2], [1], [0]]
    assert reference_buckets([16], 4) == [[0]]
    # One open bucket per kind: the bf16 layer's two parameters share one of their own.
    kinds = ["f32", "f32", "bf16", "bf16", "f32", "f32"]
    assert reference_buckets([768, 64, 512, 32, 320, 20], 1000, kinds) == [[5, 4, 1], [3, 2],
                                                                             [0]]


WRONG_MAKE_BUCKETS = {
    "first_first": ("def make_buckets(nbytes, bucket_bytes, kinds=None):\n    out, size = [[]], 0\n"
                    "    for i, n in enumerate(nbytes):\n"
                    "        if out[-1] and size + n > bucket_bytes:\n"
                    "            out.append([])\n            size = 0\n"
                    "        out[-1].append(i)\n        size += n\n    return out",
                    r"Buckets hold the parameters last first"),
    "over_the_cap": ("def make_buckets(nbytes, bucket_bytes, kinds=None):\n"
                     "    return [list(reversed(range(len(nbytes))))]",
                     r"A bucket holds more than bucket_bytes"),
    "one_each": ("def make_buckets(nbytes, bucket_bytes, kinds=None):\n"
                 "    return [[i] for i in reversed(range(len(nbytes)))]",
                 r"Fill each bucket up to bucket_bytes"),
    # The kinds read but the old rule kept: a new bucket wherever the kind changes.
    "closed_at_each_change": (
        "def make_buckets(nbytes, bucket_bytes, kinds=None):\n"
        "    kinds = kinds or [None] * len(nbytes)\n    out, size = [], 0\n"
        "    for i in reversed(range(len(nbytes))):\n"
        "        if not out or size + nbytes[i] > bucket_bytes or kinds[out[-1][0]] != kinds[i]:\n"
        "            out.append([])\n            size = 0\n"
        "        out[-1].append(i)\n        size += nbytes[i]\n    return out",
        r"kinds=\['float32', 'float32', 'bfloat16', 'bfloat16', 'float32', 'float32'\]\) "
        r"returned \[\[5, 4\], \[3, 2\], \[1, 0\]\], expected \[\[5, 4, 1\], \[3, 2\], "
        r"\[0\]\]\. Keep one open bucket per kind"),
    "kinds_ignored": ("", r"returned \[\[5, 4, 3, 2, 1\], \[0\]\].*A bucket mixes kinds"),
}


@pytest.mark.parametrize("name", WRONG_MAKE_BUCKETS)
def test_wrong_buckets_are_named_without_processes(name):
    code, match = WRONG_MAKE_BUCKETS[name]
    changes = [] if code else [("fast_ddp", "        kind = kinds[i]\n", "        kind = None\n")]
    fails(check_make_buckets, notebook(changes, extra=code).make_buckets, match=match)


OUT_OF_ORDER = '''
class FastDDP(FastDDP):
    """Launches each bucket as soon as it is full, in whatever order they fill."""

    def _launch_in_order(self, backward_done):
        if not hasattr(self, "early"):
            self.early = {}
        for i, bucket in enumerate(self.buckets):
            if i not in self.early and (backward_done or self.ready[i] == len(bucket)):
                self.early[i] = dist.all_reduce(self.buffers[i], async_op=True)
        if backward_done:
            self.handles = [self.early[i] for i in range(len(self.buckets))]
            self.early = {}
'''
WRONG_FAST = {  # and SPEC's "no_overlap", below
    "never_waits": ([("fast_ddp", "            handle.wait()  # until now the buffer may hold "
                      "a partial sum\n", "")], "", {},
                    r"returned without waiting for 3 of the 3 all-reduce handles"),
    "blocks_in_hook": ([("fast_ddp", "dist.all_reduce(self.buffers[i], async_op=True)",
                         "dist.all_reduce(self.buffers[i]) or types.SimpleNamespace("
                         "wait=lambda: None)")], "import types", {},
                       r"an all-reduce launched during backward was blocking \(async_op=False\)"),
    "out_of_order": ([], OUT_OF_ORDER, {"cases": ("unused_some",)},
                     r"The ranks' collectives differ: call \d+ is all_reduce of 90 elements .*"
                     r"on rank 0, but all_reduce of 96 elements .* launch bucket i only after"),
    "unused_never_sent": ([("fast_ddp", "        self._launch_in_order(backward_done=True)  # "
                            "missing gradients: the zeros in the buffer\n", "")], "",
                          {"cases": ("unused",)},
                          r"FastDDP \(a model with an unused branch.*all-reduced tensors of "
                          r"\[\] elements; the buckets hold \[90, 96, 192\]"),
    # What torch DDP leaves None, a zero: the flags' all-reduce made, its answer not used.
    "zero_for_unused": ([("fast_ddp", "                if used[k] == 0:\n                    "
                          "continue  # no rank used it: .grad stays None, the optimizer skips "
                          "it\n", "")], "", {"cases": ("real",)},
                        r"unused\.weight has a gradient after finish_gradient_sync, but no rank "
                        r"used it"),
}


@pytest.mark.parametrize("name", WRONG_FAST)
def test_a_wrong_fast_ddp_fails_with_its_message(name):
    changes, extra, kwargs, match = WRONG_FAST[name]
    nb = notebook(changes, extra)
    fails(check_fast_ddp, nb.FastDDP, nb.make_buckets, **kwargs, match=match)


@pytest.mark.gpu
def test_on_gpus_the_solutions_fast_ddp_passes_with_nccl_and_cpu_buffers_fail():
    """The gpu runner adds the real model's case on GPUs with nccl (check_fast_ddp does, when
    gpulab.runner is gpu), where a buffer kept on the CPU cannot be all-reduced."""
    nb = notebook()
    check_fast_ddp(nb.FastDDP, nb.make_buckets, world_size=2, cases=("mlp",))
    on_cpu = notebook([("fast_ddp", "device=bucket[0].device)", 'device="cpu")')])
    fails(check_fast_ddp, on_cpu.FastDDP, on_cpu.make_buckets, world_size=2, cases=("mlp",),
          match=r"FastDDP \(\d GPUs, nccl\).*device 'cpu'.*while the parameters are on 'cuda'")


def test_a_broadcast_on_rank_0_only_hangs_and_is_explained(quick_timeouts):
    nb = notebook([("fast_ddp", "        for p in module.parameters():\n"
                    "            dist.broadcast(p.data, src=0)\n",
                    "        for p in module.parameters():\n"
                    "            if dist.get_rank() == 0:\n"
                    "                dist.broadcast(p.data, src=0)\n")])
    fails(check_fast_ddp, nb.FastDDP, nb.make_buckets,
          match=r"did not finish within 8 s.*rank 0: waiting in broadcast.*call 1 is broadcast "
                r"of 192 elements in __init__ on rank 0, but all_reduce of 101 elements.*not "
                r"under `if rank == 0`")


# ----------------------------------------------------------------------------- Part 4


def test_the_solutions_train_ddp_passes_the_visible_and_the_hidden_tests():
    train_ddp = notebook().train_ddp
    check_train_ddp(train_ddp, world_sizes=(2, 4))
    check_train_ddp(train_ddp, world_sizes=(3,), epochs=3, global_batch_size=24, seed=5)


SET_EPOCH = "        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank\n"
WRONG_TRAIN = {  # and SPEC's "same_order_every_epoch", below
    "no_seed": ([("train_ddp", "shuffle=True,\n                                 seed=seed)",
                  "shuffle=True)")], {"world_sizes": (2,), "seed": 5},
                r"The shuffle ignored `seed`: pass it on"),
    "global_batch_per_rank": ([("train_ddp", "batch_size=global_batch_size // world_size",
                                "batch_size=global_batch_size")], {},
                              r"rank 0: its batches had \[32\] examples.*batch_size = "
                              r"global_batch_size // world_size = 16"),
    "no_sampler": ([("train_ddp", "sampler=sampler)", "shuffle=True)"),
                    ("train_ddp", SET_EPOCH, "")], {},
                   r"rank 0 ran 24 steps; 2 epochs of 192 examples in global batches of 32 are "
                   r"12\. Each rank must see only its 1/2 of the data"),
    "no_finish": ([("train_ddp", "            ddp.finish_gradient_sync()  # the mean gradient, "
                    "before the step\n", "")], {},
                  r"called finish_gradient_sync 0 times in 12 steps"),
    "step_first": ([("train_ddp", "            ddp.finish_gradient_sync()  # the mean gradient, "
                     "before the step\n            optimizer.step()\n",
                     "            optimizer.step()\n            ddp.finish_gradient_sync()\n")],
                   {}, r"optimizer\.step\(\) must come after finish_gradient_sync"),
    "own_wrapper": ([("train_ddp", "ddp = ddp_class(model)", "ddp = FastDDP(model)")], {},
                    r"never built the wrapper it was given: wrap the model with ddp = "
                    r"ddp_class\(model\)"),
}


@pytest.mark.parametrize("name", WRONG_TRAIN)
def test_a_wrong_training_loop_fails_with_its_message(name):
    changes, kwargs, match = WRONG_TRAIN[name]
    fails(check_train_ddp, notebook(changes).train_ddp, **{"world_sizes": (2,), **kwargs},
          match=match)


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(monkeypatch, mistake):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message. The ring that deadlocks is cut as in
    quick_timeouts; the wrappers keep the lab's limit: they are slow, not stuck."""
    from gpulab.checks.lab3 import ring

    monkeypatch.setattr(ring, "RING_TIMEOUT_S", 8.0)
    SPEC.expect_checker_teaches(mistake)
