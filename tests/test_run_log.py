"""gpulab.run_log writes real TensorBoard event files (read back here with TensorBoard's raw
event loader, not with gpulab's reader) and, where wandb is installed, an offline W&B run."""

import sys

import pytest
import torch

from gpulab.run_log import WANDB_MISSING, RunLog, read_scalars


def raw_scalars(tensorboard_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar record of the event files, straight from the TFRecord stream."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = sorted(tensorboard_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file under {tensorboard_dir}: SummaryWriter wrote nothing"
    found: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                # The loader turns a simple_value into a 0-d tensor of the "scalars" plugin.
                if value.metadata.plugin_data.plugin_name == "scalars":
                    (number,) = value.tensor.float_val
                    found.setdefault(value.tag, []).append((event.step, number))
    return found


def log_a_run(log_dir, steps=12, flush_every=5, **kwargs):
    """The lesson's path: tensors straight from a step, a float, context manager."""
    with RunLog(log_dir, config={"lr": 0.01}, flush_every=flush_every, **kwargs) as log:
        for step in range(steps):
            loss = torch.tensor(1.0 / (step + 1))  # a 0-d tensor, as a step returns it
            log.scalars(step, loss=loss, lr=0.01)
    return log


def test_event_files_hold_every_step_of_every_tag(tmp_path):
    log = log_a_run(tmp_path, steps=12, flush_every=5)
    raw = raw_scalars(log.tensorboard_dir)
    assert sorted(raw) == ["loss", "lr"]
    assert [step for step, _ in raw["loss"]] == list(range(12))
    assert [v for _, v in raw["loss"]] == pytest.approx([1 / (s + 1) for s in range(12)])
    assert [v for _, v in raw["lr"]] == pytest.approx([0.01] * 12)
    assert log.steps_logged == 12


def test_read_scalars_agrees_with_the_raw_records(tmp_path):
    log = log_a_run(tmp_path)
    assert read_scalars(log.tensorboard_dir) == raw_scalars(log.tensorboard_dir)  # both float32


def test_tensors_wait_on_the_device_until_a_flush(tmp_path):
    with RunLog(tmp_path, flush_every=4) as log:
        for step in range(3):
            log.scalars(step, loss=torch.tensor(float(step)))
        pending = [values["loss"] for _, values in log._pending]
        assert len(pending) == 3 and all(isinstance(v, torch.Tensor) for v in pending), \
            "scalars() must queue tensors, not read them (.item() is a sync per step)"
        log.scalars(3, loss=torch.tensor(3.0))
        assert log._pending == [], "the flush_every-th step writes the queue"
    assert [v for _, v in raw_scalars(log.tensorboard_dir)["loss"]] == [0.0, 1.0, 2.0, 3.0]


def test_logs_stay_in_the_given_folder(tmp_path):
    log = log_a_run(tmp_path / "run")
    assert log.tensorboard_dir == tmp_path / "run" / "tensorboard"
    assert {p.name for p in tmp_path.iterdir()} == {"run"}


def test_without_wandb_the_run_logs_to_tensorboard_and_says_how_to_add_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    log = log_a_run(tmp_path, use_wandb=True)
    assert log.wandb_status == WANDB_MISSING and "pip install wandb" in log.wandb_status
    assert len(raw_scalars(log.tensorboard_dir)["loss"]) == 12
    assert not (tmp_path / "wandb").exists()


def test_flush_every_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="flush_every"):
        RunLog(tmp_path, flush_every=0)


def test_with_wandb_an_offline_run_is_written_under_the_log_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")  # the explicit mode="offline" must win
    log = log_a_run(tmp_path, use_wandb=True)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline run under {tmp_path / 'wandb'}, found {runs}"
    assert list(runs[0].glob("*.wandb")), "the offline run holds no .wandb record file"
    assert "offline run" in log.wandb_status and "wandb sync" in log.wandb_status
