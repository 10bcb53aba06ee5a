"""Lab 2's hints, one part at a time: `gpulab.hint("lab2", "amp_step")` prints the next level.

Lab 2 hands out a training loop with planted bugs; its specs say what each function must achieve
and how the checker measures it, never what to change. Level 1 says where to look, level 2 what
is wrong there and why, level 3 the shape of the fixed code.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "to_device": (
        "The function already walks every container and keeps its type. Ask where the host "
        "could be made to wait: a copy to a GPU either blocks the host until it lands or is "
        "queued behind the GPU's work, and the checker counts the copies that block.",
        "Look at the one line that copies a tensor, and at how the worked example above copies "
        "x. From pinned memory a copy can run while the GPU computes, but only when it is "
        "asked for as asynchronous; on a CPU or the meta device the request changes nothing.",
        "Tensor.to takes the device and a flag that asks for an asynchronous copy, "
        "`tensor.to(device, non_blocking=...)`. Device-agnostic code always passes it, since "
        "it costs nothing where it does not apply.",
    ),
    "amp_step": (
        "Two bugs hide here, both about when things happen. Follow the gradients through the "
        "step and ask, at each call that reads them: are they the true gradients, or S times "
        "them? And ask which context is still active when backward runs.",
        "Autocast is for the forward pass and the loss; backward follows the dtypes the "
        "forward chose, so it belongs after the with block. A clip must measure the true "
        "gradient's norm, so the gradients must be divided by S before it runs; scaler.step "
        "only unscales them when nobody has yet, which is too late for the clip.",
        "The step's shape: zero the gradients; under autocast, the loss; after the block, "
        "backward on scaler.scale(loss); when clipping, scaler.unscale_(optimizer) and then "
        "clip_grad_norm_ on the parameters; then scaler.step(optimizer), scaler.update(), and "
        "return the loss detached.",
    ),
    "accumulate_gradients": (
        "The whole batch's loss is the mean over all N of its examples, not the mean of the "
        "micro-batches' means. Run the worked example's 7 + 3 split and compare with the "
        "checker's micro-batches of 16, 8 and 4 examples.",
        "Gradients are linear in the loss: weight each micro-batch's loss so that the weighted "
        "losses add up to the whole batch's mean loss, and their gradients add up to its "
        "gradient. A mean over n_i examples must count as n_i of the N examples.",
        "Count N, the examples over all the micro-batches, before the loop. In the loop, "
        "multiply each micro-batch's mean loss by len(x) / N before scaling it and calling "
        "backward; the sum of those weighted losses, detached, is the value to return.",
    ),
    "resume": (
        "A resume is exact only if every piece of state the next steps read comes back. List "
        "what changes from one step of this loop to the next: the weights, the optimizer's "
        "running averages, the random state, and one more object the step updates.",
        "The GradScaler holds state too: its current scale and how many clean steps it has "
        "counted towards the next growth. A fresh scaler starts again from its init_scale, so "
        "a resumed fp16 run would scale, skip and grow differently from the uninterrupted one.",
        "Each stateful object here has state_dict() and load_state_dict(). The snapshot keeps a "
        "copy of the scaler's state_dict() beside the others, and restore loads it into the "
        "fresh scaler before it returns the step.",
    ),
    "memorize": (
        "A model can memorize one batch only if every input keeps its own label from step to "
        "step. Look at exactly what the loop hands to amp_step at each step, input by input "
        "and label by label.",
        "Shuffling a batch is harmless only when inputs and labels move together, by one "
        "permutation applied to both. Within one batch the order does not change the mean "
        "loss at all, so it may as well stay as it is.",
        "Either index x and y with the same order, x[order] and y[order], or pass x and y as "
        "they are. Keep one optimizer and one scaler for all the steps, and convert the losses "
        "to floats once, at the end.",
    ),
}
