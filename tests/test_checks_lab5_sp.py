"""Lab 5, Part 6's checker (check_sp_block) passes the lab's answer and fails, with the message
that teaches, on the wrong SPBlocks learners write: heads split along the wrong dimension (q, k,
v by input features), heads interleaved across ranks, attention left whole on every rank, a
missing sum of out_proj's partial products, an all-gather whose backward forgets to sum,
unsynchronized norm gradients, an all-reduce where a reduce-scatter does (right numbers, twice
the bytes), and gpulab's own tensor-parallel Block.

The right code is the lab's answer cell (from solutions/), run in a fresh `__main__`, as a
kernel runs it; each wrong version is the same code with one change. Each check is one launch
of 2 gloo processes.
"""

import re
import types

import pytest
from lab_submissions import Lab, cell_by_grade_id

from gpulab.checks.lab5 import check_sp_block

pytestmark = [pytest.mark.lab5, pytest.mark.dist]
CELL_FILE = "/tmp/ipykernel_0/cell.py"  # where a kernel's cells say they come from
IMPORTS = """
import copy

import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
"""
ANSWER = cell_by_grade_id(Lab("lab5_parallelism_across_nodes").solution(), "sp_block").source


def sp_block(changes=(), extra: str = ""):
    """The answer's SPBlock with `changes`, (old, new) replacements each found exactly once."""
    source = ANSWER
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} is not once in the answer: update this test"
        source = source.replace(old, new)
    module = types.ModuleType("__main__")
    for cell in (IMPORTS, source, extra):
        exec(compile(cell, CELL_FILE, "exec"), module.__dict__)
    return module.SPBlock


def fails(match: str, block_class, **kwargs) -> None:
    with pytest.raises(AssertionError) as error:
        check_sp_block(block_class, **kwargs)
    assert re.search(match, str(error.value), re.S), str(error.value)


def test_the_answer_passes_the_visible_and_the_hidden_tests():
    check_sp_block(sp_block(), tp=2)
    check_sp_block(sp_block(), tp=4, seed=5)
    check_sp_block(sp_block(), tp=2, world_size=4, seed=3)  # strided subgroups [0, 2], [1, 3]


# A replicated attention: every rank runs all the heads on the gathered sequence, then keeps
# its tokens. The numbers are right; the memory and the work are not split.
WHOLE_ATTENTION = '''
class SPBlock(SPBlock):
    def __init__(self, block, group):
        super().__init__(block, group)
        del self.qkv_weight, self.qkv_bias, self.out_weight, self.out_bias
        self.attn = copy.deepcopy(block.attn)

    def forward(self, x):
        tokens = x.shape[1]
        mine = slice(dist.get_rank(self.group) * tokens, (dist.get_rank(self.group) + 1) * tokens)
        x = x + self.attn(GatherFromSequence.apply(self.ln_1(x), self.group))[:, mine]
        h = GatherFromSequence.apply(self.ln_2(x), self.group)
        partial = F.linear(F.gelu(F.linear(h, self.fc_weight, self.fc_bias)), self.proj_weight)
        return x + ReduceScatterToSequence.apply(partial, self.group) + self.proj_bias
'''

WRONG = {
    "heads_split_by_input_features": (
        [("self.qkv_weight = nn.ParameterList(shard(layer.weight, 0) for layer in qkv)",
          "self.qkv_weight = nn.ParameterList(shard(layer.weight, 1) for layer in qkv)")], "",
        r"q_proj\.weight is split along the wrong dimension: a parameter holds its columns "
        r"\(input features\) \(8, 4\)"),
    "heads_interleaved": (
        [("            return nn.Parameter(tensor.detach().chunk(tp_size, dim)[tp_rank].clone())",
          "            return nn.Parameter(tensor.detach().transpose(0, dim)[tp_rank::tp_size]"
          ".transpose(0, dim).clone())")], "",
        r"no parameter holds this rank's block of q_proj\.weight, shape \(4, 8\): rank 0 of the "
        r"group holds block 0 of 2 \(heads 0 to 1 for the attention\)"),
    "attention_left_whole": (
        [], WHOLE_ATTENTION,
        r"attention is left whole: a parameter holds all of q_proj\.weight, \(8, 8\), on every "
        r"rank\. Each rank holds n_head / tp_size = 2 of the 4 heads"),
    "missing_sum_after_out_proj": (
        [("        x = x + ReduceScatterToSequence.apply(partial, self.group) + self.out_bias",
          "        x = x + partial.chunk(2, dim=1)[dist.get_rank(self.group)] + self.out_bias")],
        "", r"its forward summed partial outputs 1 time\(s\), for 2 row-parallel layers: an "
        r"all-reduce is missing"),
    "gather_backward_without_sum": (
        [("        return ReduceScatterToSequence.reduce_scatter(grad, ctx.group), None",
          "        return grad.chunk(dist.get_world_size(ctx.group), dim=1)["
          "dist.get_rank(ctx.group)], None")], "",
        r"the gradient of this rank's tokens is wrong .* the all-gather's backward must sum the "
        r"ranks' gradients and keep this rank's tokens: a reduce-scatter"),
    "norm_grads_not_synced": (
        [("            dist.all_reduce(p.grad, group=self.group)", "            pass")], "",
        r"the gradient of ln_1\.weight \(ln_1\.weight\) is this rank's part only .* "
        r"sync_replicated_grads\(\) must all-reduce their gradients over the group"),
    "all_reduce_for_reduce_scatter": (
        [("        out = torch.empty_like(parts[0])\n"
          "        dist.reduce_scatter(out, parts, group=group)  # rank r: the sum of every "
          "rank's part r\n        return out",
          "        whole = x.clone()\n        dist.all_reduce(whole, group=group)\n"
          "        return whole.chunk(len(parts), dim=1)[dist.get_rank(group)].contiguous()")],
        "", r"its forward made all_gather, all_reduce, all_gather, all_reduce; with sequence "
        r"parallelism one layer makes all_gather, reduce_scatter, all_gather, reduce_scatter.*"
        r"sends twice the bytes"),
}


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_sp_block_fails_with_its_message(name):
    changes, extra, match = WRONG[name]
    fails(match, sp_block(changes, extra), tp=2)


def test_gpulabs_own_tensor_parallel_block_earns_nothing():
    borrowed = sp_block(extra='''
from gpulab.distributed.tp_transformer import tp_block_from


class SPBlock(nn.Module):
    def __init__(self, block, group):
        super().__init__()
        self.inner = tp_block_from(block, group, sequence_parallel=True)

    def forward(self, x):
        return self.inner(x)

    def sync_replicated_grads(self):
        self.inner.sync_sequence_parallel_grads()
''')
    fails(r"SPBlock ran gpulab's own code .* write it yourself", borrowed, tp=2)
