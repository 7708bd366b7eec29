"""The Hugging Face Trainer callback on a real (CPU) Trainer run: every optimizer step reaches
the relay with its sample count, construction to first step is init, a checkpoint is an event."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.progress_relay import ProgressRelay
from gpufleet.progress import Reporter

from .test_client_relay import sock_path, wait_for

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_hf_trainer_reports_its_steps(tmp_path: Path) -> None:
    from gpufleet.progress_hf import GpufleetProgress

    class Tiny(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def forward(self, x, labels=None):  # type: ignore[no-untyped-def]
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Ds(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 160

        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            g = torch.Generator().manual_seed(i)
            return {"x": torch.randn(16, generator=g), "labels": torch.randn(1, generator=g)}

    path = sock_path(tmp_path)
    relay = ProgressRelay(path)
    try:
        r = Reporter(path)
        r.init(job_id="hf-job")
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=20,
                                              per_device_train_batch_size=8, use_cpu=True, report_to=[],
                                              save_strategy="steps", save_steps=10, logging_strategy="no",
                                              disable_tqdm=True)
        tr = transformers.Trainer(model=Tiny(), args=args, train_dataset=Ds(), callbacks=[GpufleetProgress(r)])
        tr.train()
        r.flush()
        # every event flush() sent (it returns once they are in the socket) has been folded; a
        # fixed 0.3 s after the 20th step raced the last datagrams (checkpoints, spans) under load
        wait_for(lambda: relay.events >= r.stats()["sent"] >= 20, 180)
        windows = relay.drain_all()
        r.shutdown()
    finally:
        relay.close()
    assert sum(w.steps for w in windows) == 20 and max(w.last_step or 0 for w in windows) == 20
    assert sum(w.samples or 0 for w in windows) == 160
    assert sum(w.spans.get("init", 0.0) for w in windows) > 0
    assert sum(1 for w in windows for e in w.events if e["name"] == "checkpoint_saved") == 2
    assert {w.job_id for w in windows} == {"hf-job"} and windows[-1].params == 17
