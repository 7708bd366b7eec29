"""The PyTorch Lightning callback on a real (CPU) Lightning fit: every optimizer step reaches
the relay, validation is an eval span, setup an init span."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.progress_relay import ProgressRelay
from gpufleet.progress import Reporter

from .test_client_relay import sock_path, wait_for

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")


def test_lightning_fit_reports_its_steps_and_spans(tmp_path: Path) -> None:
    from gpufleet.progress_lightning import GpufleetProgress

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    dl = torch.utils.data.DataLoader(ds, batch_size=8)
    path = sock_path(tmp_path)
    relay = ProgressRelay(path)
    try:
        r = Reporter(path)
        r.init(job_id="lightning-job")
        cb = GpufleetProgress(tokens_per_batch=8 * 16, reporter=r)
        trainer = pl.Trainer(max_epochs=2, callbacks=[cb], accelerator="cpu", logger=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                             limit_val_batches=4)
        trainer.fit(Tiny(), dl, dl)
        r.flush()
        # every event flush() sent (it returns once they are in the socket) has been folded; a
        # fixed 0.3 s after the 64th step raced the last datagrams (checkpoints, spans) under load
        wait_for(lambda: relay.events >= r.stats()["sent"] >= 64, 180)
        windows = relay.drain_all()
        r.shutdown()
    finally:
        relay.close()
    assert sum(w.steps for w in windows) == trainer.global_step == 64
    assert sum(w.tokens or 0 for w in windows) == 64 * 128
    spans = {k for w in windows for k in w.spans}
    assert {"init", "eval"} <= spans, spans
    assert windows[0].params == 17
