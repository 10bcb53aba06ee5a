"""Lab 5's hints, one level per call of `gpulab.hint("lab5", part)` (gpulab/self_check/hints.py):
1 the idea, 2 the plan, 3 the arithmetic. The specs state the goal and the bound; these lead to
a design, one step at a time, without the code.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "tp_linear": (
        """
        Autograd cannot see through a collective, so f and g are written by hand: f copies in
        forward and sums the ranks' gradients in backward; g sums the partial products in
        forward and passes the gradient through in backward. A column-parallel layer needs the
        whole input and yields a block of the output; a row-parallel layer takes a block of the
        input and yields a partial sum, whose bias must be added once, after the sum.
        """,
        """
        nn.Linear stores its weight as (out_features, in_features): output features are rows,
        input features are columns. With tp_rank = dist.get_rank(group) and tp_size =
        dist.get_world_size(group), the column layer keeps a block of rows of the weight (and
        the same entries of the bias), the row layer a block of columns (and all of the bias).
        Put the group on ctx in forward; every all_reduce takes group=group. Copy the input
        before an in-place all-reduce: autograd may hand the same tensor to another branch.
        """,
        """
        per_rank = full.out_features // tp_size; rows = slice(tp_rank * per_rank, (tp_rank + 1)
        * per_rank); self.weight = nn.Parameter(full.weight.detach()[rows].clone()), and
        [:, cols] for the row layer's columns. Column forward: F.linear(CopyToTP.apply(x,
        group), weight, bias). Row forward: y = ReduceFromTP.apply(F.linear(x, weight), group),
        then y + bias. f's backward: grad = grad.clone(); dist.all_reduce(grad, group=ctx.group);
        return grad, None. f's forward returns x.view_as(x): a new tensor, the same data.
        """,
    ),
    "tp_mlp": (
        """
        Column then row: the first layer's output block is exactly the input block the second
        layer wants, and GELU acts element by element, so it runs on each rank's own hidden
        units with no communication between the two layers. The only sum is the second layer's
        partial products.
        """,
        """
        Build fc as your ColumnParallelLinear and proj as your RowParallelLinear, each from the
        original layer and the group, and keep a copy of the original dropout module. Forward:
        fc, GELU, proj (whose g all-reduces), then dropout on the summed output, which every rank
        holds whole, so that the same seed gives every rank the same mask.
        """,
        """
        __init__: self.fc = ColumnParallelLinear(mlp.fc, group); self.proj =
        RowParallelLinear(mlp.proj, group); self.drop = copy.deepcopy(mlp.drop). forward:
        return self.drop(self.proj(F.gelu(self.fc(x)))). That is one all-reduce in forward (g,
        inside proj) and one in backward (f, inside fc), and nothing else. About 5 lines.
        """,
    ),
    "one_f_one_b": (
        """
        The last stage can run each microbatch's backward right after its forward. An earlier
        stage's first backward comes back only after that microbatch has gone through every
        stage after it and back: so it runs forwards until then, which fills the pipeline, and
        that number is exactly what the in-flight bound p - stage allows.
        """,
        """
        Three phases on each stage: a warm-up of forwards only; a steady state of pairs, one
        forward then one backward, while forwards remain; a cool-down of the backwards left, in
        order. Count the warm-up so that, with the first forward of the steady state, the stage
        holds p - stage microbatches; and never more forwards than m, so that m < p works too.
        """,
        """
        warmup = min(p - stage - 1, m); order = [("F", i) for i in range(warmup)]; for i in
        range(m - warmup): order += [("F", warmup + i), ("B", i)]; then order += [("B", i) for i
        in range(m - warmup, m)]. On p = 4, m = 8, stage 0: F0 F1 F2, then F3 B0, F4 B1 ... F7
        B4, then B5 B6 B7. About 7 lines.
        """,
    ),
    "pp_tp_cluster": (
        """
        Every rank runs the same function; its place in the grid decides what it holds. Its
        pipeline coordinate picks the stage (which Blocks), its TP group splits those Blocks'
        MLPs. Then gpulab's pipeline runtime runs the microbatches through the stages in the
        order you give it, one list per stage.
        """,
        """
        pp_size and pp_rank come from groups.grid and groups.coords. split_gpt(gpt, pp_size)
        returns every stage's module: keep this rank's. Replace each of its Blocks' MLP with
        your TPMLP on groups.tp. Wrap the module in a PipelineStage on groups.pp, build the order
        of every stage with one_f_one_b_stage, cut x and y into n_microbatches pieces, and call
        run_pipeline with the loss function imported above.
        """,
        """
        module = split_gpt(gpt, pp_size)[pp_rank]; for block in module.blocks.values():
        block.ff = TPMLP(block.ff, groups.tp). stage = PipelineStage(module, pp_rank, pp_size,
        group=groups.pp); order = [one_f_one_b_stage(pp_size, m, s) for s in range(pp_size)];
        result = run_pipeline(stage, order, list(x.chunk(m)), list(y.chunk(m)), cross_entropy);
        return module, result. Do not divide the loss yourself: run_pipeline already does.
        """,
    ),
    "cloud_job": (
        """
        Every number the cloud needs follows from the scenario: the machines and their GPUs give
        the processes, the driver caps the CUDA of the image, the processes give the shared
        memory, and the preemption rate with the restart and save times gives a window of
        checkpoint intervals.
        """,
        """
        One process per GPU: procs_per_node = gpus_per_node = 8 on each of 2 nodes; spot=True
        and max_restarts above zero. Pick a PyTorch image built for CUDA 12.4 or older. shm_gb
        is per node: 2 GiB times the processes on it. The rate given is one VM's; any VM's
        preemption stops the whole job, so the job's λ adds up its VMs' rates. For the interval
        τ, the preemption loss λ(τ/2 + r) grows with τ and the saving cost c/τ shrinks: both
        must stay at or under 5%.
        """,
        """
        The job's λ = 2 x 0.025 = 0.05 per hour. With r = 0.25 h and c = 2/60 h: λ(τ/2 + r) <=
        0.05 gives τ <= 1.5 h (90 minutes), and c/τ <= 0.05 gives τ >= 2/3 h (40 minutes).
        One VM's rate alone would allow 3.5 h, too long for the job. Young's interval,
        sqrt(2c/λ) = about 1.15 h (gpulab.cloud_cost.young_checkpoint_interval), sits inside:
        args=("--checkpoint-every-min", "69"); shm_gb = 16; base_image
        "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime".
        """,
    ),
    "sp_block": (
        """
        Heads never look at each other until out_proj mixes them, so whole heads can live on
        different ranks: q, k and v split by output features (column-parallel), out_proj by
        input features (row-parallel), exactly like the MLP's fc and proj. Sequence parallelism
        then cuts what is left, the norms and residual adds, by tokens: gather the tokens where
        the parallel region starts, and sum-and-scatter them where it ends.
        """,
        """
        Each layer norm runs on this rank's tokens; all-gather its output along dim 1 before q,
        k, v (and fc); run this rank's heads on the whole sequence; out_proj's and proj's
        partial products go through a reduce-scatter along dim 1, which sums them and leaves
        each rank its own tokens; add the whole biases after it. The backward of an all-gather
        is a reduce-scatter of the gradient and the other way round. After backward, the norms
        and those two biases hold only their rank's part of the gradient: all-reduce them.
        """,
        """
        A head is head_size consecutive output features: with per = C // tp_size, rank r keeps
        rows r*per:(r+1)*per of q_proj, k_proj, v_proj (weights and biases) and columns
        r*per:(r+1)*per of out_proj.weight; fc and proj as in Part 2. In forward, view each
        of q, k, v as (B, T, -1, head_size) and transpose(1, 2) before
        F.scaled_dot_product_attention(..., is_causal=True). The collectives: dist.all_gather
        into a list, then torch.cat(dim=1); dist.reduce_scatter(out, list(x.chunk(tp_size,
        dim=1))), each chunk made contiguous.
        """,
    ),
    "interleaved": (
        """
        The bubble is the time the pipeline takes to fill and to drain. With two chunks per
        device each visit costs half, so a device can start useful work sooner, but only if the
        next microbatches reach its first chunk before its second chunk has anything to do.
        Keep the memory bound in mind: it decides when a backward must come before a forward.
        """,
        """
        Send microbatches through in rounds: p of them through chunk 0, then the same p through
        chunk 1, then the next p; backwards in rounds too, chunk 1 before chunk 0. Each device
        warms up with forwards only, then alternates one forward and one backward, then drains
        the backwards left. Count the warm-up so that its first backward has come back by the
        time it asks for it: later devices need fewer forwards to get there.
        """,
        """
        Number a device's forwards k = 0 .. 2m - 1: round k // (2p), chunk (k % 2p) // p,
        microbatch (k // 2p) p + k % p; backwards alike with the chunk reversed. A warm-up of
        2(p - stage - 1) + p forwards (at most 2m) on device `stage` fills both chunks'
        pipelines; then pairs of one forward and one backward; then the backwards left.
        """,
    ),
}
