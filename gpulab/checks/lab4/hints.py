"""Lab 4's hints, one level per call of `gpulab.hint("lab4", part)` (gpulab/self_check/hints.py).

Each part has three levels: 1 the idea, 2 the plan, 3 the arithmetic or the shape of the code.
The specs in the notebook state only the goal, the interface and the bound; these say how.
Taught in: lessons/07_gpu_memory.ipynb (Part A), lessons/08_profiling_and_optimization.ipynb
(Part B)
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "diagnosis": (
        """
        The peak is one moment of the step, and `measured.breakdown` says how many bytes
        each category held at that moment. Answer from it, not from the OOM report, which
        shows an earlier moment, part-way through the forward pass.""",
        """
        `measured.breakdown.as_dict()` maps each category's name to its bytes at the peak,
        and `.total` is their sum. The model states are three of those rows (parameters,
        gradients, optimizer) as they stand at the peak, not as they would after backward.""",
        """
        The dominant category is the dict's key with the largest value. Its share is its
        bytes over the total, a fraction between 0 and 1; the ratio is its bytes over the sum
        of the parameters, gradients and optimizer rows.""",
    ),
    "fit_step": (
        """
        The activations dominate, and they grow with the number of sequences that go
        through the model at once. Send fewer at a time and let backward add their gradients
        up in .grad: the optimizer can still step once, on the whole batch.""",
        """
        Clear the previous step's gradients before the first backward (the checker leaves
        them in .grad), split x and y along the batch into micro-batches small enough to fit
        (the estimates above say how small), backward each one, then step once. The last
        micro-batch may be shorter than the others.""",
        """
        The whole batch's mean loss is a weighted sum of the micro-batches' means: weight
        each by len(x_micro) / len(x) before its backward, so every sequence counts 1/B even
        when B does not split evenly. Return the sum of those weighted losses, each detached;
        checkpointing or bf16 autocast can let the micro-batches be larger.""",
    ),
    "profile_reading": (
        """
        Two measurements answer the four questions: the phases of `profile` say where the
        step's time goes, and `transfers` counts what crosses between the host and the device.
        Read every answer from those objects, per step.""",
        """
        `profile.phases()` holds each phase's time per step and its share of the step,
        "other" included, and `.shares()` gives the shares as a dict. `transfers` holds means
        per step over the steps it counted: its syncs and its bytes copied host to device.""",
        """
        The dominant phase is the key of `profile.phases().shares()` with the largest value,
        and its share is that value, a fraction. The counts are the syncs and the bytes
        attributes of `transfers`: per step, not per micro-batch, and in bytes, not kilobytes.""",
    ),
    "fast_results": (
        """
        Match slow_train's docstring, not its structure. It defines each step's examples,
        their transform, the loss and the update, and none of them needs doing one example or
        one micro-batch at a time to come out the same.""",
        """
        The order of the examples can be built once (example_order gives it), the transform
        is the same arithmetic for every image, and a batch's mean loss is the same in one
        piece as in weighted pieces. Each step: clear the gradients, one backward, one
        optimizer.step(), on the model and optimizer you are given.""",
        """
        Reshape the (N, 8, 8) images to (N, 64) floats, divide by 16, and standardize each
        row with its own mean and its std with correction=0: every image at once. Index those
        rows with each step's batch_size positions of the order, and return one Python float
        per step, the loss before that step's update.""",
    ),
    "fast_technique": (
        """
        A CPU hides what a GPU pays for: every read of a device value by the host makes it
        wait, every small copy from host memory blocks, and every forward pass launches its
        own kernels. The bound counts a whole call, so what happens once costs little a step.""",
        """
        Put what the whole run needs on the model's device before the loop (the data set is
        1,797 small images), keep every value made inside the loop on the device, send the
        whole batch through the model at once, and read the losses back after the last step.""",
        """
        Inside the loop: no .item(), .cpu(), float() or .tolist(), no torch.tensor(...) of
        Python values and no .to(device) of host data; index device tensors with device
        indices, one model call per step. After the loop, torch.stack(losses).tolist() reads
        every loss in a single sync.""",
    ),
    "speedup": (
        """
        The time goes where the profile said it goes: shrink the largest phase first.
        Whatever is still done per example, or per micro-batch, in Python pays the same
        interpreter overhead on every step, however little arithmetic it does.""",
        """
        The transform is the same for every image and the data set is small: do it once, for
        all the images, as tensor operations, and reuse the result on every step. Then one
        batch a forward pass instead of micro-batches, and no waits inside the loop.""",
        """
        A fast step is a handful of tensor operations: index the transformed (N, 64) inputs
        and the labels, forward, cross-entropy, clear the gradients, backward, step. The clock
        covers the whole call, the one-off transform included; profile your fast_train with
        profile_steps and phase() labels to see what is left.""",
    ),
}
