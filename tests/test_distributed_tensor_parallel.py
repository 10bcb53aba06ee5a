"""Tensor parallelism against the unsharded reference: the communication ops against their
definitions, the parallel linears against nn.Linear, TP and sequence-parallel Blocks (ours and
DTensor's) against gpulab.models.Block, outputs and gradients; the collectives each one issues
against tp_layer_comm; known-wrong versions caught. One launch of 4 gloo ranks runs every check
at tp_size=4 (the whole world) and at tp_size=2 (the two TP groups of RankGrid(2, 1, 2)), and
the ops and Blocks at tp_size=1 (every op the identity)."""

from collections import Counter

import pytest
import torch

from gpulab.distributed import run_on_ranks
from gpulab.distributed.tp_transformer import tp_layer_comm

TP_SIZES = (2, 4)
B, T, C, N_HEAD = 2, 8, 32, 4  # T and N_HEAD divisible by every tp_size
RTOL = 1e-5  # fp32: the sharded sums differ from the reference only in summation order


def _rel(got, want) -> float:
    """Largest difference relative to the largest reference value, or absolute where that is
    below 1: k_proj's bias gets no gradient (softmax ignores a shift shared by every key), so
    its reference gradient is rounding noise, and noise relative to noise means nothing."""
    return ((got - want).abs().max() / want.abs().max().clamp_min(1.0)).item()


def _random_block(seed):
    """A Block with every parameter random (GPT's init zeroes biases: a bias added on every
    rank would then go unseen)."""
    from gpulab.models import Block, GPTConfig

    torch.manual_seed(seed)
    block = Block(GPTConfig(block_size=T, n_head=N_HEAD, n_embd=C))
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    return block


def _block_grad_errors(tp, ref) -> dict:
    """Every parameter of a TPBlock against the matching slice of the reference's gradient."""
    def cat(*names):
        return torch.cat([ref.get_parameter(n).grad for n in names])

    qkv = [f"attn.{p}_proj" for p in "qkv"]
    want = {
        "ln_1.weight": ref.ln_1.weight.grad, "ln_1.bias": ref.ln_1.bias.grad,
        "ln_2.weight": ref.ln_2.weight.grad, "ln_2.bias": ref.ln_2.bias.grad,
        "attn.qkv.weight": tp.attn.qkv.shard_of(cat(*(f"{n}.weight" for n in qkv))),
        "attn.qkv.bias": tp.attn.qkv.shard_of(cat(*(f"{n}.bias" for n in qkv))),
    }
    for name in ("attn.out_proj", "ff.fc", "ff.proj"):
        layer = tp.get_submodule(name)
        for kind in ("weight", "bias"):
            want[f"{name}.{kind}"] = layer.shard_of(ref.get_parameter(f"{name}.{kind}").grad)
    assert sorted(want) == sorted(n for n, _ in tp.named_parameters())
    return {f"grad {n}": _rel(p.grad, want[n]) for n, p in tp.named_parameters()}


def _run_block(tp_block, ref, x, w, sp, tp_rank, tp_size, sync=True):
    """Forward and backward of a (TP or DTensor) block on this rank's input; errors of the output
    and of the input's gradient against the reference (whose backward already ran)."""
    shard = slice(tp_rank * T // tp_size, (tp_rank + 1) * T // tp_size) if sp else slice(None)
    x_mine = x.detach()[:, shard].clone().requires_grad_()
    y = tp_block(x_mine)
    (y * w[:, shard]).sum().backward()  # with sp: the ranks' losses add up to the reference's
    if sp and sync:
        tp_block.sync_sequence_parallel_grads()
    return {"output": _rel(y, ref(x)[:, shard]), "grad x": _rel(x_mine.grad, x.grad[:, shard])}


def _op_errors(group, tp_rank, tp_size) -> dict:
    """Each communication op on rank-dependent inputs, against its definition written out with
    every rank's input (deterministic per rank, so each rank can compute all of them)."""
    from gpulab.distributed import tensor_parallel as tpl

    xs = [torch.randn(B, T, C, generator=torch.Generator().manual_seed(r)) for r in range(tp_size)]
    ws = [torch.randn(B, T, C, generator=torch.Generator().manual_seed(100 + r))
          for r in range(tp_size)]
    x_same, w_same = xs[0], ws[0]  # an activation every rank holds whole

    def chunk(t, dim, r):
        return t.chunk(tp_size, dim)[r]

    def cat_chunks(ts, dim):
        return torch.cat([chunk(t, dim, r) for r, t in enumerate(ts)], dim)

    def cases():  # name: (op, input, grad of output, expected output, expected input grad)
        r = tp_rank
        yield "copy_to_tp", tpl.copy_to_tp, xs[r], ws[r], xs[r], sum(ws)
        yield "reduce_from_tp", tpl.reduce_from_tp, xs[r], ws[r], sum(xs), ws[r]
        yield ("split_to_tp", tpl.split_to_tp, x_same, chunk(ws[r], -1, r), chunk(x_same, -1, r),
               cat_chunks(ws, -1))
        yield ("gather_from_tp", tpl.gather_from_tp, chunk(xs[r], -1, r), w_same,
               cat_chunks(xs, -1), chunk(w_same, -1, r))
        yield ("scatter_to_sequence", tpl.scatter_to_sequence, x_same, chunk(ws[r], 1, r),
               chunk(x_same, 1, r), cat_chunks(ws, 1))
        yield ("gather_from_sequence", tpl.gather_from_sequence, chunk(xs[r], 1, r), ws[r],
               cat_chunks(xs, 1), chunk(sum(ws), 1, r))
        yield ("reduce_scatter_to_sequence", tpl.reduce_scatter_to_sequence, xs[r],
               chunk(ws[r], 1, r), chunk(sum(xs), 1, r), cat_chunks(ws, 1))

    out = {}
    for name, op, x, w, want_y, want_grad in cases():
        x = x.clone().requires_grad_()
        y = op(x, group)
        (y * w).sum().backward()
        out[f"{name} forward"] = _rel(y, want_y)
        out[f"{name} backward"] = _rel(x.grad, want_grad)
    return out


def _linear_errors(group, tp_rank, tp_size) -> dict:
    """Column- and row-parallel layers from an nn.Linear, in each input/output mode."""
    from torch import nn

    from gpulab.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(1)
    lin = nn.Linear(C, 2 * C)
    x, w = torch.randn(B, T, C, requires_grad=True), torch.randn(B, T, 2 * C)
    (lin(x) * w).sum().backward()
    out = {}
    for gather_output in (False, True):
        col = ColumnParallelLinear.from_linear(lin, group, gather_output=gather_output)
        cols = slice(None) if gather_output else slice(col.start, col.end)
        x_mine = x.detach().clone().requires_grad_()
        y = col(x_mine)
        (y * w[..., cols]).sum().backward()
        tag = f"column gather_output={gather_output}"
        out[f"{tag} output"] = _rel(y, lin(x)[..., cols])
        out[f"{tag} grad x"] = _rel(x_mine.grad, x.grad)
        out[f"{tag} grad weight"] = _rel(col.weight.grad, col.shard_of(lin.weight.grad))
        out[f"{tag} grad bias"] = _rel(col.bias.grad, col.shard_of(lin.bias.grad))
    for input_is_parallel in (True, False):
        row = RowParallelLinear.from_linear(lin, group, input_is_parallel=input_is_parallel)
        ins = slice(row.start, row.end) if input_is_parallel else slice(None)
        x_mine = x.detach()[..., ins].clone().requires_grad_()
        y = row(x_mine)
        (y * w).sum().backward()
        tag = f"row input_is_parallel={input_is_parallel}"
        out[f"{tag} output"] = _rel(y, lin(x))
        out[f"{tag} grad x"] = _rel(x_mine.grad, x.grad[..., ins])
        out[f"{tag} grad weight"] = _rel(row.weight.grad, row.shard_of(lin.weight.grad))
        out[f"{tag} grad bias"] = _rel(row.bias.grad, lin.bias.grad)
    return out


def _gpt_errors(group) -> dict:
    """apply_tensor_parallel on a 2-layer GPT: logits and every gradient."""
    import torch.nn.functional as F

    from gpulab.distributed.tp_transformer import apply_tensor_parallel
    from gpulab.models import GPT, GPTConfig

    torch.manual_seed(2)
    ref = GPT(GPTConfig(vocab_size=16, block_size=T, n_layer=2, n_head=N_HEAD, n_embd=C))
    idx = torch.randint(0, 16, (B, T))
    model = apply_tensor_parallel(ref, group)
    out = {}
    for m in (ref, model):
        logits = m(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
        out[m is model] = logits
    errors = {"logits": _rel(out[True], out[False])}
    for i in range(2):
        for name, e in _block_grad_errors(model.blocks[i], ref.blocks[i]).items():
            errors[f"blocks.{i} {name}"] = e
    for name in ("embed.wte.weight", "embed.wpe.weight", "ln_f.weight", "lm_head.weight"):
        errors[f"grad {name}"] = _rel(model.get_parameter(name).grad, ref.get_parameter(name).grad)
    return errors


def _dtensor_errors(ref, x, w, tp_mesh, sp, tp_rank, tp_size) -> dict:
    from torch.distributed.tensor import DTensor

    from gpulab.distributed.tp_dtensor import parallelize_block

    block = parallelize_block(ref, tp_mesh, sequence_parallel=sp)
    errors = _run_block(block, ref, x, w, sp, tp_rank, tp_size, sync=False)  # DTensor's own
    for name, p in block.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        errors[f"grad {name}"] = _rel(grad, ref.get_parameter(name).grad)
    if sp:  # the layernorm gradients are Partial(sum): does an optimizer step sum them?
        lr, before = 0.1, ref.ln_1.weight.detach().clone()
        torch.optim.SGD(block.parameters(), lr=lr).step()
        errors["ln_1 after SGD step"] = _rel(block.ln_1.weight.full_tensor(),
                                             before - lr * ref.ln_1.weight.grad)
    return errors


def _counts(block, x, w, sp, tp_rank, tp_size) -> tuple[dict, dict]:
    from gpulab.distributed.tp_transformer import count_collectives

    shard = slice(tp_rank * T // tp_size, (tp_rank + 1) * T // tp_size) if sp else slice(None)
    x_mine = x.detach()[:, shard].clone().requires_grad_()
    held = {}
    forward = count_collectives(lambda: held.setdefault("y", block(x_mine)))
    backward = count_collectives(lambda: (held["y"] * w[:, shard]).sum().backward())
    return forward, backward


def _wrong_versions(ref, x, w, group, tp_rank, tp_size) -> dict:
    """Known-wrong TP blocks: the error each one leaves where the tests look."""
    import torch.nn.functional as F

    from gpulab.distributed.tensor_parallel import reduce_from_tp
    from gpulab.distributed.tp_transformer import tp_block_from

    def bias_on_every_rank(tp):
        proj = tp.ff.proj
        proj.forward = lambda h: reduce_from_tp(F.linear(h, proj.weight, proj.bias), group)

    def g_without_all_reduce(tp):
        proj = tp.ff.proj
        proj.forward = lambda h: F.linear(h, proj.weight) + proj.bias

    def f_without_all_reduce(tp):
        for layer in (tp.attn.qkv, tp.ff.fc):
            layer.forward = lambda h, layer=layer: F.linear(h, layer.weight, layer.bias)

    def qkv_split_in_thirds(tp):  # rank r takes rows r of the stacked [q; k; v], not its heads
        with torch.no_grad():
            for kind in ("weight", "bias"):
                stacked = torch.cat([getattr(getattr(ref.attn, f"{p}_proj"), kind) for p in "qkv"])
                getattr(tp.attn.qkv, kind).copy_(stacked.chunk(tp_size)[tp_rank])

    out = {}
    for name, wrong, sp, look_at in [
            ("bias on every rank", bias_on_every_rank, False, "output"),
            ("g without all-reduce", g_without_all_reduce, False, "output"),
            ("f without all-reduce", f_without_all_reduce, False, "grad x"),
            ("qkv split in thirds", qkv_split_in_thirds, False, "output"),
            ("sequence-parallel grads not summed", None, True, "grad ln_1.weight")]:
        tp = tp_block_from(ref, group, sequence_parallel=sp)
        if wrong:
            wrong(tp)
        errors = _run_block(tp, ref, x, w, sp, tp_rank, tp_size, sync=wrong is not None)
        errors.update(_block_grad_errors(tp, ref))
        out[name] = errors[look_at]
    return out


def _tp_checks(rank, world_size):
    import torch.distributed as dist

    from gpulab.distributed.groups import RankGrid, device_mesh, new_groups
    from gpulab.distributed.tp_dtensor import parallelize_block
    from gpulab.distributed.tp_transformer import tp_block_from

    results = {}
    for tp_size in TP_SIZES:
        grid = RankGrid.for_world(world_size, tp_size=tp_size)
        group, tp_mesh = new_groups(grid).tp, device_mesh(grid, "cpu")["tp"]
        tp_rank = dist.get_rank(group)
        ref = _random_block(seed=0)
        x, w = torch.randn(B, T, C, requires_grad=True), torch.randn(B, T, C)
        (ref(x) * w).sum().backward()
        res = {"ops": _op_errors(group, tp_rank, tp_size),
               "linears": _linear_errors(group, tp_rank, tp_size), "gpt": _gpt_errors(group),
               "wrong": _wrong_versions(ref, x, w, group, tp_rank, tp_size)}
        for sp in (False, True):
            tp = tp_block_from(ref, group, sequence_parallel=sp)
            res[f"block sp={sp}"] = _run_block(tp, ref, x, w, sp, tp_rank, tp_size)
            res[f"block sp={sp}"].update(_block_grad_errors(tp, ref))
            res[f"dtensor sp={sp}"] = _dtensor_errors(ref, x, w, tp_mesh, sp, tp_rank, tp_size)
            res[f"counts sp={sp}"] = _counts(tp_block_from(ref, group, sp), x, w, sp,
                                             tp_rank, tp_size)
            dtensor_block = parallelize_block(ref, tp_mesh, sp)
            res[f"dtensor counts sp={sp}"] = _counts(dtensor_block, x, w, sp, tp_rank, tp_size)
            res[f"dtensor rows sp={sp}"] = dtensor_block.attn.q_proj.weight.to_local().shape[0]
        res["errors"] = _error_messages(group, tp_mesh, tp_size)
        results[tp_size] = res
    # tp_size=1: every op is the identity, every layer the whole one
    group = new_groups(RankGrid.for_world(world_size, tp_size=1)).tp
    ref = _random_block(seed=0)
    x, w = torch.randn(B, T, C, requires_grad=True), torch.randn(B, T, C)
    (ref(x) * w).sum().backward()
    results[1] = {"ops": _op_errors(group, 0, 1)}
    for sp in (False, True):
        tp = tp_block_from(ref, group, sequence_parallel=sp)
        results[1][f"block sp={sp}"] = _run_block(tp, ref, x, w, sp, 0, 1)
        results[1][f"block sp={sp}"].update(_block_grad_errors(tp, ref))
    return results


def _error_messages(group, tp_mesh, tp_size) -> list[str]:
    """What a shape that does not divide over the ranks says."""
    from gpulab.distributed.tensor_parallel import ColumnParallelLinear, scatter_to_sequence
    from gpulab.distributed.tp_dtensor import parallelize_block
    from gpulab.distributed.tp_transformer import tp_block_from
    from gpulab.models import Block, GPTConfig

    block = Block(GPTConfig(n_head=tp_size // 2, n_embd=C))  # fewer heads than ranks
    attempts = [lambda: tp_block_from(block, group), lambda: parallelize_block(block, tp_mesh),
                lambda: ColumnParallelLinear(C, tp_size + 1, group),
                lambda: scatter_to_sequence(torch.zeros(B, tp_size + 1, C), group)]
    messages = []
    for attempt in attempts:
        try:
            attempt()
            messages.append("no error")
        except ValueError as error:
            messages.append(str(error))
    return messages


@pytest.fixture(scope="module")
def per_rank():
    return run_on_ranks(_tp_checks, 4, timeout_s=120, backend="gloo")


def _assert_close(per_rank, key, tp_sizes=TP_SIZES):
    for rank, results in enumerate(per_rank):
        for tp_size in tp_sizes:
            for what, err in results[tp_size][key].items():
                assert err <= RTOL, (f"{key}, tp_size={tp_size}, rank {rank}: {what} is off by "
                                     f"{err:.2e} (relative) from the unsharded reference")


@pytest.mark.dist
def test_communication_ops_match_their_definitions(per_rank):
    _assert_close(per_rank, "ops", (1, *TP_SIZES))


@pytest.mark.dist
def test_parallel_linears_match_nn_linear(per_rank):
    _assert_close(per_rank, "linears")


@pytest.mark.dist
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sequence parallel"])
def test_tp_block_matches_block(per_rank, sp):
    _assert_close(per_rank, f"block sp={sp}", (1, *TP_SIZES))


@pytest.mark.dist
def test_tp_gpt_matches_gpt(per_rank):
    _assert_close(per_rank, "gpt")


@pytest.mark.dist
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sequence parallel"])
def test_dtensor_block_matches_block(per_rank, sp):
    for results in per_rank:
        for tp_size in TP_SIZES:
            rows = results[tp_size][f"dtensor rows sp={sp}"]
            assert rows == C // tp_size, "the DTensor weight is not sharded over the TP ranks"
    _assert_close(per_rank, f"dtensor sp={sp}")


@pytest.mark.dist
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sequence parallel"])
def test_collectives_issued_match_the_accounting(per_rank, sp):
    for results in per_rank:
        for tp_size in TP_SIZES:
            comm = tp_layer_comm(C, tp_size, sequence_parallel=sp)
            forward, backward = results[tp_size][f"counts sp={sp}"]
            assert forward == Counter(comm.forward) and backward == Counter(comm.backward)
            forward, backward = results[tp_size][f"dtensor counts sp={sp}"]
            assert forward == Counter(comm.forward)
            # DTensor keeps q, k, v as three layers: three input gradients to all-reduce
            assert backward == (Counter(comm.backward) if sp else {"all_reduce": 4})


@pytest.mark.dist
def test_known_wrong_versions_are_caught(per_rank):
    for rank, results in enumerate(per_rank):
        for tp_size in TP_SIZES:
            for name, err in results[tp_size]["wrong"].items():
                assert err > 1e-2, f"tp_size={tp_size}, rank {rank}: '{name}' went unnoticed"


@pytest.mark.dist
def test_shapes_that_do_not_divide_are_refused(per_rank):
    for results in per_rank:
        for tp_size in TP_SIZES:
            heads, heads_dtensor, rows, sequence = results[tp_size]["errors"]
            assert f"n_head={tp_size // 2} is not a multiple of tp_size={tp_size}" in heads
            assert "each rank whole heads" in heads_dtensor
            assert f"out_features={tp_size + 1} is not a multiple of tp_size" in rows
            assert f"cannot split dim 1 of size {tp_size + 1}" in sequence


def test_sequence_parallel_sends_the_same_bytes_as_tp():
    for tp_size in (1, 2, 4, 8):
        tp, sp = tp_layer_comm(4096, tp_size), tp_layer_comm(4096, tp_size, sequence_parallel=True)
        assert tp.message_bytes == sp.message_bytes == 4096 * 2
        assert tp.sent_forward == pytest.approx(sp.sent_forward)
        assert tp.sent_backward == pytest.approx(sp.sent_backward)
        # two ring all-reduces of one token's activation, each 2 (p - 1) / p of the message
        assert tp.sent_forward == pytest.approx(2 * 2 * (tp_size - 1) / tp_size * 4096 * 2)
        assert Counter(sp.forward) == {"all_gather": 2, "reduce_scatter": 2}
    assert tp_layer_comm(64, 2, bytes_per_element=4).sent_backward == pytest.approx(2 * 64 * 4)
