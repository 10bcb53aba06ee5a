"""Lab 3's hints, one level per call of `gpulab.hint("lab3", part)` (gpulab/self_check/hints.py):
1 the idea, 2 the plan, 3 the arithmetic. The specs state the goal and the bound; these lead to
a design, one step at a time, without the code.
Taught in: lessons/04_distributed_fundamentals.ipynb, lessons/05_multi_gpu_strategies.ipynb
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "ring_all_reduce": (
        """
        Cut the tensor into p chunks, one per rank. In the reduce-scatter each chunk travels
        once around the ring, and every rank it passes adds its own copy in: after p - 1 steps
        each rank holds one chunk that is complete, a different one on every rank. The
        all-gather then passes the complete chunks on around the ring, p - 1 more steps, each
        rank overwriting its stale copy with what arrives.
        """,
        """
        Work on one flat, contiguous 1-D view: tensor.contiguous().view(-1) is the tensor
        itself when it is contiguous, and a copy otherwise (copy the result back at the end).
        flat.tensor_split(p) gives p views that share its memory, sizes differing by at most
        one, empty when n < p. Each step: post the send to the right neighbour and the receive
        from the left one together (batch_isend_irecv, or isend and irecv, then wait on both),
        receive into a spare buffer during the reduce-scatter (you combine it, elementwise, with
        torch.add or torch.maximum), and straight into the chunk during the all-gather.
        """,
        """
        With right = (r + 1) % p and left = (r - 1) % p, at reduce-scatter step s = 0 .. p - 2
        rank r sends chunk (r - s) % p and receives chunk (r - s - 1) % p, which it combines
        into its own copy; after the last step rank r's chunk (r + 1) % p is complete. At
        all-gather step s = 0 .. p - 2 it sends chunk (r - s + 1) % p and receives chunk
        (r - s) % p in place. Check on p = 3: at reduce-scatter step 0, rank 0 sends chunk 0
        and receives chunk 2, which rank 2 sends at that step.
        """,
    ),
    "simple_ddp": (
        """
        Data parallelism stays exact when every replica starts from the same parameters and
        takes the same step: one collective at construction copies rank 0's parameters
        everywhere, and one per gradient after backward turns each rank's gradient into the
        mean over the ranks (a sum over the ranks divided by the world size).
        """,
        """
        In __init__, dist.broadcast(p.data, src=0) for every parameter, on every rank: rank 0
        sends, the others receive in place. In finish_gradient_sync, skip frozen parameters.
        The others need one decision every rank agrees on: did any rank use this parameter?
        A rank alone cannot tell, so share it first: one small all-reduce of a flag per
        trainable parameter, 1.0 where this rank has a gradient. Then all-reduce exactly the
        parameters whose flags sum above zero, in the same order on every rank.
        """,
        """
        used = torch.tensor([float(p.grad is not None) for p in params],
        device=params[0].device), then dist.all_reduce(used). For each parameter with
        used > 0: if this rank's p.grad is None, set it to torch.zeros_like(p) (this rank adds
        nothing, but its all-reduce is still in line); then dist.all_reduce(p.grad) and
        p.grad /= dist.get_world_size(). A parameter with used == 0 keeps None everywhere.
        About 12 lines.
        """,
    ),
    "fast_ddp": (
        """
        Two ideas: fewer, larger messages (each all-reduce pays a fixed latency, so group the
        gradients into buckets), and sending them while backward still runs (backward
        computes the last layer's gradients first, so the bucket of the last parameters can
        travel while earlier layers are still being differentiated). make_buckets is a greedy
        walk from the last parameter to the first, one open bucket per kind.
        """,
        """
        make_buckets: walk i from len(nbytes) - 1 down to 0; keep, per kind, the index of its
        open bucket and its bytes; open a new bucket for the kind when it has none or when
        nbytes[i] would take it past the cap. FastDDP.__init__: broadcast, then the trainable
        parameters' buckets; one torch.zeros buffer per bucket (its dtype, its device); a
        place per parameter (bucket, offset); and p.register_post_accumulate_grad_hook on each.
        The hook copies p.grad into its place, counts it, and launches what is ready.
        """,
        """
        Launch in order: while len(handles) < len(buckets), bucket i = len(handles) goes with
        handles.append(dist.all_reduce(buffers[i], async_op=True)) if all its gradients are in
        (or backward is done); otherwise stop, even if a later bucket is complete. In
        finish_gradient_sync: launch the rest (backward_done=True), all-reduce the used-flags
        (Part 2), then for each handle: wait(), divide the buffer by the world size, copy each
        used parameter's slice, buffer[offset:offset + p.numel()].view_as(p), into p.grad; zero
        the buffers, the counts and the flags for the next step.
        """,
    ),
    "train_ddp": (
        """
        A data-parallel step is one process's step with the global batch dealt out: the ranks'
        batches together must be exactly the batch one process would take, and every rank must
        hold the same model. DistributedSampler deals out the examples; its epoch decides the
        order, and it changes only when you tell it.
        """,
        """
        Build the model right after torch.manual_seed(seed), so every rank makes the same one,
        then wrap it and build SGD on model.parameters(). DistributedSampler(dataset,
        num_replicas=world_size, rank=rank, shuffle=True, seed=seed) and a DataLoader over it
        whose batch size is this rank's share of the global batch. Each step: zero the
        gradients, forward through the wrapper, backward, finish_gradient_sync, step.
        """,
        """
        batch_size = global_batch_size // world_size. For epoch in range(epochs), call
        sampler.set_epoch(epoch) before iterating: without it every epoch repeats epoch 0's
        order. Keep each loss as loss.detach() in a list, and return
        (torch.stack(losses).tolist(), model.state_dict()): one conversion at the end. About 20
        lines.
        """,
    ),
    "sharded_adamw": (
        """
        Every rank takes the same step, so the state need not be copied: give each rank one
        slice of the parameters to own. A step is then three moves: bring each slice's mean
        gradient to its owner, let the owner alone run AdamW on its slice, and hand every
        updated slice back to every rank so the replicas are whole again.
        """,
        """
        Think of all the parameters as one flat vector, padded with zeros to world_size equal
        slices; rank r owns slice r. In __init__ keep an fp32 copy of your slice as a tensor
        that requires grad, and build torch.optim.AdamW over that one tensor: its exp_avg and
        exp_avg_sq are then your slice's. In step(): flatten the gradients the same way,
        reduce-scatter them into your slice, divide by the world size, step, then all-gather
        the slices into a whole vector made inside step() and copy it back into the
        parameters.
        """,
        """
        size = ceil(n / world_size) elements a slice, so the padded vector has size *
        world_size; rank r's slice is elements r * size .. (r + 1) * size - 1. The gradient
        goes through dist.reduce_scatter_tensor(out, padded_grads) with out of `size`
        elements, then into your copy's .grad; the update leaves through
        dist.all_gather_into_tensor(whole, copy) and whole[:n].split(the tensors' numels),
        each piece .view_as its parameter and copied into it under torch.no_grad(). About 20
        lines in all.
        """,
    ),
}
