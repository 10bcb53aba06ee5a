"""The capstone's hints, one level per call of `gpulab.hint("capstone", part)`
(gpulab/self_check/hints.py): 1 the idea, 2 the plan, 3 the shape of the code. The specs state the
constraints (memory per rank, which mesh axis shards what, an exact resume); these lead to a
design, one step at a time. The written answer (Part 6) is graded by hand and has none.
Taught in: lessons/05_multi_gpu_strategies.ipynb, 06_model_pipeline_tensor_parallelism.ipynb,
07_gpu_memory.ipynb
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "sharded_training": (
        """
        FSDP2 works in units: each unit's weights are sharded over a mesh axis and gathered
        just before the unit runs. One unit for the whole model gathers everything at once;
        one unit per Block, plus the root for what is left, gathers one Block at a time. The
        order matters: whatever changes a Block's layers (tensor parallelism, checkpointing)
        goes first, and the sharding wraps the result.
        """,
        """
        Three steps, in this order, each only when the plan asks: split each Block over
        mesh["tp"] with parallelize_module and block_tp_plan() (tp_size > 1); wrap the Blocks
        for recomputation with checkpoint_blocks(model); then fully_shard every Block, and
        last the root model, on mesh["dp"], all with the same MixedPrecisionPolicy. For PLAN,
        dp_size=4 is FSDP2 alone; a plan with tp_size=2 also works on this cluster.
        """,
        """
        parallelize_module (torch.distributed.tensor.parallel) takes one Block, the "tp"
        sub-mesh and the plan's dict of layer styles. fully_shard takes a module, the "dp"
        sub-mesh as mesh= and a MixedPrecisionPolicy as mp_policy=: one policy serves every
        unit, its param_dtype the plan's, its reduce_dtype float32. The per-Block steps sit in
        one loop over model.blocks; the root's fully_shard comes last, outside the loop, so it
        owns only what no Block does. Return the same model object. About 10 lines.
        """,
    ),
    "memory_plan": (
        """
        A rank's peak is what it keeps between steps (its shards of the weights, the AdamW
        state, and the gradients when they outlive a microbatch) plus what one step adds at
        its worst moment: a microbatch's activations and temporaries, and the weights FSDP2
        has gathered at that moment. Read the measured breakdown the test prints and match it
        term by term.
        """,
        """
        model_states(config.n_params, "fp32", "adamw", zero_stage=3, world_size=plan.dp_size)
        gives the sharded fp32 weights, gradients and optimizer state. estimate_transformer with
        the microbatch size, plan.micro_batch_size(config), the plan's compute precision and
        its checkpointing gives .peak.activations and .peak.temporary. Then add the gathered
        weights in the compute dtype: the root's (everything outside the Blocks) and two
        Blocks' (the one running and the next one's prefetch), each divided by tp_size.
        """,
        """
        A Block has 12 C^2 + 13 C parameters (C = config.n_embd); the root holds
        config.n_params - n_layer * that. gathered = (root + 2 * block / tp_size) * itemsize,
        itemsize 2 for bf16 or fp16, 4 for fp32. With grad_accum_steps > 1 the peak moves
        into backward, where the gradient shard already exists and one Block's whole fp32
        gradient waits for its reduce-scatter: add grad_bytes + 4 * block / tp_size then.
        Sum it all; check the prediction against the printed breakdown.
        """,
    ),
    "elastic_resume": (
        """
        A bit-for-bit replay needs everything that shapes the next updates: the weights, and
        AdamW's moments and step count too. With FSDP2 each rank holds only shards, so every
        rank writes its own part of one checkpoint, together, and a checkpoint counts only once
        its metadata, written last, exists.
        """,
        """
        Save: get_state_dict(model, optimizer) gives the model's and the optimizer's sharded
        state dicts; put both in one dict and dcp.save it into a folder of its own per step,
        whose name sorts by step. Load: list the step folders that hold a .metadata file, take
        the newest, build the same dict from the live model and optimizer, dcp.load into it
        (in place), and set_state_dict it back; return that step, or 0 when none is complete.
        """,
        """
        One folder per checkpoint under `folder`, named after its step zero-padded (so that
        sorting the names sorts the steps): dcp.save and dcp.load take it as checkpoint_id.
        The saved dict has two entries, the model's and the optimizer's state dicts from
        get_state_dict. To load, build that same two-entry dict from the live model and
        optimizer first (dcp.load fills it in place), then hand both halves to set_state_dict.
        Skip folders without a .metadata file, and read the step back from the newest name.
        """,
    ),
    "preemption": (
        """
        The handler and the save live apart. The handler runs wherever the main thread
        happens to be, even inside a collective, so it only notes that the notice came; the
        loop's next step boundary is the safe place to act. And since one node alone is
        told, the ranks must agree there before any of them starts a checkpoint.
        """,
        """
        install_notice_handler sets a module-level flag to False and installs, with
        signal.signal, a SIGTERM handler that sets it to True. handle_notice turns the flag
        into a tensor and all-reduces it with MAX, so that every rank sees whether any was
        told; when so, every rank calls save_checkpoint with the steps done, then exits with
        REQUEUE_EXIT_CODE. Part 3's load_checkpoint then finds that checkpoint newest.
        """,
        """
        The flag is a global: `global notice_came` in install_notice_handler and in the
        nested handler (which takes signum and frame) that sets it. In handle_notice,
        torch.tensor([1.0 if notice_came else 0.0]) goes through dist.all_reduce with
        op=dist.ReduceOp.MAX; if its item() is nonzero, save_checkpoint(folder, model,
        optimizer, step), then raise SystemExit(REQUEUE_EXIT_CODE). About 12 lines in all.
        """,
    ),
    "hang_diagnosis": (
        """
        A collective returns only once every rank of the group has called it. So the ranks
        that called it wait there together, and the one that skipped it is elsewhere: waiting
        alone in the call that came after, or already finished. The majority points at the
        missing call; the odd one out is the rank to blame.
        """,
        """
        Read the report's lines about the ranks, not its stacks: each running rank has one
        line saying which collective it waits in, and a line lists the ranks that finished.
        Count the ranks per collective: the collective most of them wait in is the missing
        one; the rank not among them is the one that skipped it.
        """,
        """
        One regular expression over the lines gives {rank: collective} for the ranks that
        wait, such as r"rank (\\d+): waiting in (\\w+)"; another pulls the rank numbers
        out of the "Finished:" line. collections.Counter(...).most_common(1) names the
        missing collective. Return (rank, collective) with the rank an int and the name as
        the report spells it. About 10 lines.
        """,
    ),
}
