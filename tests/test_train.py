"""gpulab.train: the loop learns, accumulation gives the big batch's gradient, the GradScaler
unscales before clipping, checkpoints resume bit for bit, and the memorization test works."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpulab import checkpoint, data, models
from gpulab import train as training
from gpulab.env import AutocastRecipe

BF16 = AutocastRecipe("cpu", "bfloat16", False)
BF16_SCALED = AutocastRecipe("cpu", "bfloat16", True)  # a GradScaler on the CPU, to test its order


class NoisyBlobs(Dataset):
    """Blobs whose items draw from NumPy's and Python's global generators, as augmentation does."""

    def __init__(self, n=24):
        self.base = data.Blobs(n, seed=1)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x + 0.1 * float(np.random.randn()) + 0.01 * random.random(), y


def fresh(seed=0, dropout=0.2, lr=1e-2):
    torch.manual_seed(seed)
    model = models.MLP(2, 3, hidden=16, dropout=dropout)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def run(steps, loader_kind="seeded", amp=None, accum=1, **kwargs):
    model, optimizer = fresh()
    ds = NoisyBlobs()
    if loader_kind == "seeded":
        loader = data.make_loader(ds, batch_size=4, seed=3, num_workers=0)
    else:  # a learner's plain loader: RandomSampler drawing from torch's global generator
        loader = DataLoader(ds, batch_size=4, shuffle=True)
    history = training.train(model, loader, optimizer, steps=steps, device="cpu", amp=amp,
                             grad_accum_steps=accum, progress=False, **kwargs)
    return history, model


def scramble_generators():
    torch.manual_seed(1234)
    np.random.seed(99)
    random.seed(7)


def same_parameters(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_loss_goes_down_on_blobs():
    torch.manual_seed(0)
    model = models.MLP(2, 3, hidden=32)
    loader = data.make_loader(data.Blobs(256, spread=0.5), batch_size=32)
    history = training.train(model, loader, torch.optim.Adam(model.parameters(), lr=1e-2),
                             steps=40, device="cpu", progress=False)
    assert history.steps == 40 and history.resumed_from == 0
    assert np.mean(history.losses[-5:]) < 0.5 * np.mean(history.losses[:5])


def test_epochs_count_micro_batches_across_passes():
    seen = []

    def counting_loss(y_hat, y):
        seen.append(len(y))
        return training.cross_entropy(y_hat, y)

    model, optimizer = fresh()
    loader = data.make_loader(data.Blobs(24), batch_size=4)  # 6 batches per pass
    history = training.train(model, loader, optimizer, epochs=3, grad_accum_steps=2,
                             device="cpu", loss_fn=counting_loss, progress=False)
    assert history.steps == 9 and len(seen) == 18


def accumulated_gradients(grad_accum_steps, batch_size):
    torch.manual_seed(0)
    model = models.MLP(2, 3, hidden=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: keep the gradients to compare
    loader = data.make_loader(data.Blobs(16), batch_size=batch_size, shuffle=False)
    training.train(model, loader, optimizer, steps=1, grad_accum_steps=grad_accum_steps,
                   device="cpu", progress=False)
    return [p.grad for p in model.parameters()]


def test_gradient_accumulation_equals_the_large_batch_gradient():
    big = accumulated_gradients(grad_accum_steps=1, batch_size=16)
    accumulated = accumulated_gradients(grad_accum_steps=4, batch_size=4)
    for g_big, g_acc in zip(big, accumulated, strict=True):
        assert g_big.abs().max() > 0
        # Only the order of fp32 additions differs: equal to within a few units of rounding.
        torch.testing.assert_close(g_acc, g_big, rtol=1e-5, atol=1e-7,
                                   msg="each micro-batch loss must be divided by grad_accum_steps")


def test_clip_norm_bounds_the_update():
    def update_norm(clip_norm):
        torch.manual_seed(0)
        model = models.MLP(2, 3, hidden=16)
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        loader = data.make_loader(data.Blobs(16, seed=2), batch_size=16)
        training.train(model, loader, torch.optim.SGD(model.parameters(), lr=1.0), steps=1,
                       clip_norm=clip_norm, device="cpu", progress=False)
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        return (after - before).norm().item()

    assert update_norm(None) > 0.1
    assert update_norm(0.01) == pytest.approx(0.01, rel=1e-4)  # SGD lr 1: the step is the grad


def test_grad_scaler_unscales_before_clipping(tmp_path):
    """Scaling by a power of two and unscaling is exact, so with the scaler the run must equal
    the run without it, even when clipping changes the update; clipping scaled gradients would
    shrink every step by the scale factor."""
    path = tmp_path / "scaled.pt"
    scramble_generators()
    plain, m_plain = run(6, amp=BF16, clip_norm=0.05)
    scramble_generators()
    scaled, m_scaled = run(6, amp=BF16_SCALED, clip_norm=0.05, checkpoint_path=path)
    scramble_generators()
    unclipped, _ = run(6, amp=BF16)
    assert plain.losses != unclipped.losses, "clip_norm=0.05 should change this run"
    assert scaled.losses == plain.losses and same_parameters(m_scaled, m_plain)
    saved = torch.load(path, weights_only=True)
    assert saved["scaler"]["scale"] == 2.0**16, "the GradScaler was not in use"


@pytest.mark.parametrize("amp", [None, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("loader_kind, accum", [("seeded", 1), ("seeded", 2), ("plain", 1)])
def test_resume_continues_bit_identically(tmp_path, amp, loader_kind, accum):
    """10 steps straight = 5 steps, save, scrambled generators, new objects, resume to 10.
    24 samples in batches of 4: the runs cross pass boundaries, the checkpoint is mid-pass."""
    path = tmp_path / "run.pt"
    scramble_generators()
    straight, m_straight = run(10, loader_kind, amp, accum)
    scramble_generators()
    first, _ = run(5, loader_kind, amp, accum, checkpoint_path=path)
    assert first.steps == 5 and path.exists()
    torch.manual_seed(42)  # anything the resumed run does not restore would now differ
    np.random.seed(42)
    random.seed(42)
    resumed, m_resumed = run(10, loader_kind, amp, accum, checkpoint_path=path, resume=True)
    assert resumed.resumed_from == 5
    assert resumed.losses == straight.losses
    assert same_parameters(m_resumed, m_straight)


def test_resume_with_worker_processes(tmp_path):
    """Workers draw their augmentation noise from generators seeded as each pass begins: the
    resumed run must rebuild the pass and reload the batches the checkpoint had consumed."""
    path = tmp_path / "run.pt"

    def run_workers(steps, **kwargs):
        model, optimizer = fresh()
        loader = data.make_loader(NoisyBlobs(), batch_size=4, seed=3, num_workers=2,
                                  persistent_workers=False)
        return training.train(model, loader, optimizer, steps=steps, device="cpu",
                              progress=False, **kwargs)

    scramble_generators()
    straight = run_workers(10)
    scramble_generators()
    run_workers(8, checkpoint_path=path)  # 6 batches per pass: stops 2 batches into pass 1
    torch.manual_seed(42)
    resumed = run_workers(10, checkpoint_path=path, resume=True)
    assert resumed.losses == straight.losses


def test_resume_without_the_rng_state_diverges(tmp_path, monkeypatch):
    """The bit-identical test above can fail: skip restoring the generators and it does."""
    path = tmp_path / "run.pt"
    scramble_generators()
    straight, _ = run(10)
    scramble_generators()
    run(5, checkpoint_path=path)
    monkeypatch.setattr(training, "restore_rng_state", lambda state: None)
    torch.manual_seed(42)
    resumed, _ = run(10, checkpoint_path=path, resume=True)
    assert resumed.losses[:5] == straight.losses[:5]
    assert resumed.losses[5:] != straight.losses[5:]


def test_resume_without_a_checkpoint_starts_at_step_zero(tmp_path):
    path = tmp_path / "sub" / "run.pt"
    history, _ = run(4, checkpoint_path=path, checkpoint_every=2, resume=True)
    assert history.resumed_from == 0 and path.exists()
    state = torch.load(path, weights_only=True)["state"]
    assert state["step"] == 4 and len(state["losses"]) == 4
    again, _ = run(4, checkpoint_path=path, resume=True)  # already done: nothing to train
    assert again.resumed_from == 4 and again.losses == history.losses


def test_rng_state_round_trips():
    scramble_generators()
    state = checkpoint.capture_rng_state()
    want = (torch.rand(3), np.random.rand(3), random.random())
    checkpoint.restore_rng_state(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_amp_recipe_must_match_the_device():
    with pytest.raises(ValueError, match="silently"):
        training.resolve_amp(AutocastRecipe("cuda", "float16", True), torch.device("cpu"))
    assert training.resolve_amp(True, torch.device("cpu")) == BF16
    assert training.resolve_amp(None, torch.device("cpu")) is None


def test_argument_mistakes_are_explained():
    model, optimizer = fresh()
    loader = data.make_loader(data.Blobs(8), batch_size=4)
    with pytest.raises(ValueError, match="exactly one"):
        training.train(model, loader, optimizer, device="cpu")
    with pytest.raises(ValueError, match="grad_accum_steps"):
        training.train(model, loader, optimizer, steps=1, grad_accum_steps=0, device="cpu")
    with pytest.raises(ValueError, match="checkpoint_path"):
        training.train(model, loader, optimizer, steps=1, resume=True, device="cpu")
    with pytest.raises(ValueError, match="no batches"):
        training.train(model, [], optimizer, steps=1, device="cpu", progress=False)


def test_progress_bar_shows_steps(capsys):
    model, optimizer = fresh()
    loader = data.make_loader(data.Blobs(16), batch_size=4)
    training.train(model, loader, optimizer, steps=12, device="cpu", progress=True)
    assert "12/12" in capsys.readouterr().err


def test_overfit_one_batch_memorizes_with_the_tiny_gpt():
    ds = data.ReverseSequences(n_samples=16, length=4, vocab_size=8)
    torch.manual_seed(0)
    gpt = models.GPT(models.GPTConfig(vocab_size=8, block_size=ds.block_size, n_layer=1,
                                      n_head=2, n_embd=32))
    result = training.overfit_one_batch(gpt, (ds.x, ds.y), steps=60, lr=1e-2, device="cpu")
    assert result.passed and result.final_loss < result.threshold
    assert result.losses[0] > 1.0 and len(result.losses) == 60


def test_overfit_one_batch_reports_a_model_that_cannot_learn():
    blobs = data.Blobs(32, n_classes=4)
    torch.manual_seed(0)
    result = training.overfit_one_batch(models.MLP(2, 4), (blobs.x, blobs.y), steps=20, lr=0.0,
                                        device="cpu")
    assert not result.passed and result.final_loss > 1.0


def test_small_cnn_learns_the_digits():
    pytest.importorskip("sklearn")
    torch.manual_seed(0)
    model = models.SmallCNN()
    loader = data.make_loader(data.Digits("train"), batch_size=64)
    training.train(model, loader, torch.optim.Adam(model.parameters(), lr=3e-3), steps=60,
                   device="cpu", progress=False)
    test = data.Digits("test")
    with torch.no_grad():
        accuracy = (model.eval()(test.x).argmax(1) == test.y).float().mean().item()
    assert accuracy > 0.85, f"held-out accuracy {accuracy:.2f} after 60 steps"


@pytest.mark.gpu
def test_fp16_with_grad_scaler_on_cuda(tmp_path):
    fp16 = AutocastRecipe("cuda", "float16", True)
    path = tmp_path / "cuda.pt"

    def cuda_run(steps, **kwargs):
        model, optimizer = fresh()
        loader = data.make_loader(data.Blobs(64, seed=1), batch_size=8, seed=3, num_workers=0)
        history = training.train(model, loader, optimizer, steps=steps, device="cuda", amp=fp16,
                                 clip_norm=1.0, progress=False, **kwargs)
        return history, model

    straight, m_straight = cuda_run(30)
    assert np.mean(straight.losses[-5:]) < np.mean(straight.losses[:5])
    cuda_run(15, checkpoint_path=path)
    saved = torch.load(path, weights_only=True)
    assert 0 < saved["scaler"]["scale"] < float("inf") and "cuda" in saved["state"]["rng"]
    torch.manual_seed(42)
    resumed, m_resumed = cuda_run(30, checkpoint_path=path, resume=True)
    assert resumed.losses == straight.losses and same_parameters(m_resumed, m_straight)
