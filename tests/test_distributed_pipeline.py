"""Pipeline parallelism against the unsplit GPT: split_gpt composes to the model exactly; the
runtime (run_pipeline) under GPipe, 1F1B and other valid orders, and torch.distributed.pipelining,
give the whole batch's loss and gradients, hold the microbatches each schedule should, and
wait for their inputs (the measured times respect every dependency). One launch of 4 gloo
ranks runs p = 4 on the whole world and p = 2 on the two pipelines of RankGrid(2, 2, 1)."""

import pytest
import torch

from gpulab.distributed import run_on_ranks
from gpulab.distributed.pipeline import measured_schedule
from gpulab.distributed.pipeline_split import GPTStage, split_gpt, stage_layers
from gpulab.distributed.schedule import check_schedule, gpipe_order, one_f_one_b_order
from gpulab.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=32, block_size=8, n_layer=4, n_head=2, n_embd=16)
B = 8  # batch: divisible by every m
MICROBATCHES = (1, 2, 4)
RTOL = 1e-5  # fp32: microbatching changes only the order of the gradient sums


def _model_and_batch(seed):
    """A GPT with every parameter random (GPT's init zeroes biases and sets layernorms to 1:
    a bug that drops them would go unseen), and a batch of ids and next-token targets."""
    torch.manual_seed(seed)
    gpt = GPT(CONFIG)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.2)
    x = torch.randint(0, CONFIG.vocab_size, (B, CONFIG.block_size))
    y = torch.randint(0, CONFIG.vocab_size, (B, CONFIG.block_size))
    return gpt, x, y


def _grad_error(module, ref_grads) -> tuple[float, str]:
    """The worst parameter's gradient error, relative to its reference gradient (or to 1e-3 of
    the largest one, for gradients that are rounding noise: k_proj's bias gets none, since
    softmax ignores a shift shared by every key). Names are the GPT's (GPTStage keeps them)."""
    floor = 1e-3 * max(g.abs().max() for g in ref_grads.values())
    worst = (0.0, "")
    for name, p in module.named_parameters():
        want = ref_grads[name]
        if p.grad is None:
            return (float("inf"), f"{name} (no gradient)")
        err = ((p.grad - want).abs().max() / torch.maximum(want.abs().max(), floor)).item()
        worst = max(worst, (err, name))
    return worst


# ---- splitting (one process) ----------------------------------------------------------------

@pytest.fixture
def one_thread():
    """Tiny matmuls: with several threads on a busy machine, the threads' hand-offs cost more
    than the work (100x here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("n_layer,n_stages", [(4, 1), (4, 2), (4, 4), (5, 3), (7, 2)])
def test_split_gpt_composes_to_the_model_exactly(n_layer, n_stages, one_thread):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=n_layer, n_head=2, n_embd=16))
    x = torch.randint(0, 32, (3, 8))
    stages = split_gpt(gpt, n_stages)
    assert len(stages) == n_stages and all(isinstance(s, GPTStage) for s in stages)
    h = x
    for stage in stages:
        h = stage(h)
    want = gpt(x)
    assert torch.equal(h, want), "the stages, composed, must compute gpt's forward exactly"
    # every parameter of gpt in exactly one stage, under its own name, equal and not shared
    names = [n for stage in stages for n, _ in stage.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in gpt.named_parameters())
    ref = dict(gpt.named_parameters())
    for stage in stages:
        for name, p in stage.named_parameters():
            assert torch.equal(p, ref[name]) and p.data_ptr() != ref[name].data_ptr(), name
    # balanced by Blocks, in order
    sizes = [len(stage.blocks) for stage in stages]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_layer
    assert [int(i) for stage in stages for i in stage.blocks] == list(range(n_layer))
    assert stages[0].embed is not None and stages[-1].lm_head is not None
    # the same gradients, exactly: backward through the composition
    h.sum().backward()
    want.sum().backward()
    for stage in stages:
        for name, p in stage.named_parameters():
            assert torch.equal(p.grad, ref[name].grad), name


def test_stage_layers_and_errors():
    assert stage_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError, match="every stage needs at least one Block"):
        stage_layers(2, 3)
    with pytest.raises(ValueError, match="n_stages must be an int >= 1"):
        stage_layers(2, 0)


# ---- one launch: the runtime and torch.distributed.pipelining --------------------------------

def _reversed_backwards(p, m):
    """GPipe with the first stage running its backwards last-to-first: valid, and it receives
    the gradients in another order than stage 1 sends them (only tags match them up)."""
    order = gpipe_order(p, m)
    order[0] = [a for a in order[0] if a[0] == "F"] + [("B", i) for i in reversed(range(m))]
    return order


def _deadlocking(p, m):
    """Stage 0 runs B0 before F1, stage 1 runs F1 before B0: each waits for the other."""
    order = gpipe_order(p, m)
    order[0] = [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    order[1] = [("F", 1), ("F", 0), ("B", 0), ("B", 1)]
    return order


def _pipelines_on_four_ranks(rank, world_size):
    from gpulab.distributed.groups import RankGrid, new_groups
    from gpulab.distributed.pipeline import PipelineStage, run_pipeline
    from gpulab.distributed.pipeline_torch import torch_pipeline
    from gpulab.distributed.schedule import ScheduleError
    from gpulab.train import cross_entropy

    torch.set_num_threads(1)
    groups = new_groups(RankGrid(2, 2, 1))  # two pipelines: ranks [0, 2] and [1, 3]
    out = {}
    setups = [(4, None, rank, 0), (2, groups.pp, groups.coords.pp_rank, 1 + groups.coords.dp_rank)]
    for p, group, s, seed in setups:
        gpt, x, y = _model_and_batch(seed)
        ref_loss = cross_entropy(gpt(x), y)
        ref_loss.backward()
        ref_grads = {n: q.grad for n, q in gpt.named_parameters()}
        out[("ref", p)] = ref_loss.item()
        module = split_gpt(gpt, p)[s]
        orders = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}
        if p == 4:
            orders["reversed backwards"] = _reversed_backwards
        runs = [(name, m, False) for name in orders for m in MICROBATCHES]
        runs += [("GPipe", 4, True)] if p == 4 else []  # blocking sends: GPipe still runs
        for name, m, blocking in runs:
            module.zero_grad(set_to_none=True)
            stage = PipelineStage(module, s, p, group)
            result = run_pipeline(stage, orders[name](p, m), list(x.chunk(m)), list(y.chunk(m)),
                                  cross_entropy, blocking_sends=blocking)
            out[("ours", p, name + " blocking" * blocking, m)] = (
                result, _grad_error(module, ref_grads))
        if p == 4:
            out["deadlock"] = "run_pipeline ran a deadlocking order"
            try:
                run_pipeline(PipelineStage(module, s, p), _deadlocking(p, 2), list(x.chunk(2)),
                             list(y.chunk(2)), cross_entropy)
            except ScheduleError as error:
                out["deadlock"] = str(error)
            try:
                PipelineStage(module, (s + 1) % p, p)
            except ValueError as error:
                out["wrong stage"] = str(error)
        for name in ("GPipe", "1F1B"):
            for m in MICROBATCHES:
                module.zero_grad(set_to_none=True)
                try:
                    pipe = torch_pipeline(module, s, p, m, cross_entropy, name, group)
                except ValueError as error:
                    out[("torch", p, name, m)] = str(error)
                    continue
                losses = pipe.step(x, y)
                out[("torch", p, name, m)] = (losses, _grad_error(module, ref_grads))
    return out


def _check_timeline(results, order, p, m, where):
    """The stages ran their lists as given, one action after another, each compute starting
    only after what it needed had been computed on the neighbour (one clock: one machine)."""
    measured = measured_schedule(results)
    assert measured.order() == order, f"{where}: the stages did not run the order they were given"
    check_schedule(measured.order(), p, m)
    assert measured.peak_in_flight == [r.peak_held for r in results]
    end = {(a.kind, a.microbatch, a.stage): a.end for a in measured.actions}
    for r in results:
        previous_end = -1.0
        for t in r.timings:
            assert t.wait_start <= t.start <= t.end and t.wait_start >= previous_end, where
            previous_end = t.end
    for a in measured.actions:
        needs = [("F", a.microbatch, a.stage - 1)] if a.kind == "F" else [
            ("F", a.microbatch, a.stage), ("B", a.microbatch, a.stage + 1)]
        for dep in needs:
            if dep in end:
                assert a.start >= end[dep], (
                    f"{where}: stage {a.stage} started {a.kind}{a.microbatch} before {dep[0]}"
                    f"{dep[1]} ended on stage {dep[2]}: it did not wait for its input")


@pytest.mark.dist
def test_pipelines_match_the_unsplit_model():
    per_rank = run_on_ranks(_pipelines_on_four_ranks, 4, timeout_s=60, backend="gloo")
    # p = 4: rank r is stage r. p = 2: pipelines [0, 2] and [1, 3], stage = rank // 2.
    pipelines = {4: [[0, 1, 2, 3]], 2: [[0, 2], [1, 3]]}
    for p, ranks_of in pipelines.items():
        for ranks in ranks_of:
            ref_loss = per_rank[ranks[-1]][("ref", p)]
            keys = [k for k in per_rank[ranks[0]] if k[0] in ("ours", "torch") and k[1] == p]
            assert len(keys) == (16 if p == 4 else 12)
            for key in keys:
                impl, _, name, m = key
                where = f"p={p} (ranks {ranks}), {impl} {name}, m={m}"
                outs = [per_rank[r][key] for r in ranks]
                if impl == "torch" and name == "1F1B" and m < p:
                    assert "must be greater than or equal to the number of stages" in outs[0]
                    continue
                for s, (_, (err, param)) in enumerate(outs):
                    assert err < RTOL, (f"{where}: stage {s}'s gradient of {param} is off by "
                                        f"{err:.2e} (relative) from the unsplit model's")
                if impl == "torch":
                    losses = outs[-1][0]
                else:
                    results = [o[0] for o in outs]
                    losses = results[-1].losses
                    assert all(r.losses == () for r in results[:-1])
                    held = [r.peak_held for r in results]
                    want = ([min(p - s, m) for s in range(p)] if name == "1F1B"
                            else [m] * p)
                    assert held == want, f"{where}: peak microbatches held {held}, expected {want}"
                    order = {"1F1B": one_f_one_b_order,
                             "reversed backwards": _reversed_backwards}.get(name, gpipe_order)
                    _check_timeline(results, order(p, m), p, m, where)
                assert len(losses) == m
                assert sum(losses) / m == pytest.approx(ref_loss, rel=RTOL), (
                    f"{where}: mean microbatch loss {sum(losses) / m} vs the whole batch's "
                    f"{ref_loss}")
    for rank in range(4):  # checked before any message: every rank raises, none hangs
        assert "the order deadlocks" in per_rank[rank]["deadlock"]
        assert f"this rank is {rank} of 4 in the pipeline's group, but was told it is stage " \
            f"{(rank + 1) % 4} of 4" in per_rank[rank]["wrong stage"]
    with pytest.raises(ValueError, match="need one result per stage 0..3"):
        measured_schedule([per_rank[r][("ours", 4, "GPipe", 2)][0] for r in (0, 1, 3)])
