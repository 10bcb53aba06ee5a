"""All-reduce built by hand from point-to-point messages (isend/irecv), in place.

ring_all_reduce   reduce-scatter then all-gather around a ring: 2(p-1) steps of n/p elements
tree_all_reduce   reduce up a binomial tree, broadcast back down: 2*ceil(log2 p) steps of n elements
Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_chunks(rank: int, step: int, p: int, phase: str) -> tuple[int, int]:
    """(chunk this rank sends right, chunk it receives from the left) at `step` of `phase`.
    After p-1 reduce-scatter steps, rank r holds the full sum of chunk (r + 1) % p."""
    shift = 0 if phase == "reduce-scatter" else 1
    return (rank - step + shift) % p, (rank - step - 1 + shift) % p


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over the group's ranks, in place, with a ring of send/recv (any size, any
    world size). Each rank sends 2(p-1) messages of about n/p elements: bandwidth-optimal."""
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    if p == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)  # (n,)
    chunks = list(flat.tensor_split(p))  # p views of n/p elements (sizes differ by at most 1)
    right, left = _global(group, (rank + 1) % p), _global(group, (rank - 1) % p)
    incoming = torch.empty_like(chunks[0])  # chunk 0 is among the largest
    for step in range(p - 1):  # reduce-scatter: add the left neighbour's partial sums
        send, recv = ring_chunks(rank, step, p, "reduce-scatter")
        _exchange(chunks[send], right, incoming[:chunks[recv].numel()], left, group,
                  on_arrival=lambda got, part, mine=chunks[recv]: mine[part].add_(got))
    for step in range(p - 1):  # all-gather: pass the finished chunks around
        send, recv = ring_chunks(rank, step, p, "all-gather")
        _exchange(chunks[send], right, chunks[recv], left, group)
    if flat.data_ptr() != tensor.data_ptr():  # the input was not contiguous: copy back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def tree_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over the group's ranks, in place: a binomial tree reduces to rank 0 in
    ceil(log2 p) rounds (in round k, ranks with bit k set send to rank - 2**k), then the same
    tree broadcasts the total back. Whole-buffer messages: fewer steps than the ring (wins when
    latency, alpha, dominates) but each link carries the full buffer every round."""
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    if p == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    incoming = torch.empty_like(work)
    mask = 1
    while mask < p:  # reduce: a rank sends its subtree's sum once, then its part is done
        if rank & mask:
            dist.send(work, _global(group, rank - mask), group=group)
            break
        if rank + mask < p:
            dist.recv(incoming, _global(group, rank + mask), group=group)
            work.add_(incoming)
        mask <<= 1
    lowest = rank & -rank  # the round in which this rank sent (0 for the root)
    if rank:
        dist.recv(work, _global(group, rank - lowest), group=group)
    mask = (lowest or 1 << (p - 1).bit_length()) >> 1
    while mask:  # broadcast: pass the total to the ranks this one received from
        if rank + mask < p:
            dist.send(work, _global(group, rank + mask), group=group)
        mask >>= 1
    if work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work)
    return tensor


def _global(group, group_rank: int) -> int:
    """send/recv take global ranks; a subgroup's rank i is some other global rank."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


SEGMENT = 1 << 18  # elements per message in a long exchange (1 MiB of fp32)


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group,
              on_arrival=None) -> None:
    """Send to `dst` while receiving from `src`, posted together so that neither side waits for
    the other to finish first (a ring of blocking sends would deadlock).

    A long chunk travels as segments of SEGMENT elements, each with its own tag, and
    on_arrival(segment, its slice) runs as soon as that segment is in: the add of one segment
    overlaps the transfer of the next (pipelining, as NCCL does). Empty chunks (n < p) are
    skipped on both sides: the neighbour computes the same sizes."""
    n_segments = max(1, -(-max(send.numel(), recv.numel()) // SEGMENT))
    parts = [slice(i * SEGMENT, (i + 1) * SEGMENT) for i in range(n_segments)]
    receives, sends = [], []
    for tag, part in enumerate(parts):
        if recv[part].numel():
            receives.append((part, dist.P2POp(dist.irecv, recv[part], src, group, tag)))
        if send[part].numel():
            sends.append(dist.P2POp(dist.isend, send[part], dst, group, tag))
    ops = [op for _, op in receives] + sends
    requests = dist.batch_isend_irecv(ops) if ops else []
    for (part, _), request in zip(receives, requests, strict=False):
        request.wait()  # wait on each request once: a second wait on a gloo request can hang
        if on_arrival is not None:
            on_arrival(recv[part], part)
    for request in requests[len(receives):]:
        request.wait()
