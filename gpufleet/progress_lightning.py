"""PyTorch Lightning callback for ``gpufleet.progress`` (docs/progress.md, "Adapters").

    trainer = lightning.Trainer(callbacks=[GpufleetProgress(tokens_per_batch=4096)])

Reports every optimizer step (``trainer.global_step``; resuming from a checkpoint makes it go
back, which is how restarts are seen), spans for setup, checkpoint saves and loads, and
validation (``eval``). Lightning is imported only here, never by ``gpufleet.progress``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from gpufleet import progress


class GpufleetProgress(pl.Callback):
    def __init__(self, tokens_per_batch: int | None = None, samples_per_batch: int | None = None,
                 flops_per_step: float | None = None, reporter: progress.Reporter | None = None) -> None:
        self.tokens = tokens_per_batch
        self.samples = samples_per_batch
        self.flops = flops_per_step
        self.r = reporter
        self._spans: dict[str, Any] = {}
        self._last = -1

    def _open(self, kind: str) -> None:
        cm = (self.r.span(kind) if self.r is not None else progress.span(kind))
        cm.__enter__()
        self._spans[kind] = cm

    def _close(self, kind: str) -> None:
        cm = self._spans.pop(kind, None)
        if cm is not None:
            cm.__exit__(None, None, None)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        params = sum(p.numel() for p in pl_module.parameters())
        (self.r.init if self.r is not None else progress.init)(rank=trainer.global_rank,
                                                              world_size=trainer.world_size,
                                                              flops_per_step=self.flops, params=params)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._open("init")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close("init")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last:  # gradient accumulation: not an optimizer step yet
            return
        self._last = step
        samples = self.samples
        if samples is None:
            try:
                samples = len(batch[0] if isinstance(batch, list | tuple) else batch)
            except TypeError:
                samples = None
        (self.r.step if self.r is not None else progress.step)(step, tokens=self.tokens, samples=samples)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._open("eval")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close("eval")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Lightning calls this before it writes the file: the span covers the state gathering;
        # the write itself is in the next step's time (documented limit).
        self._open("checkpoint_save")
        self._close("checkpoint_save")

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        (self.r.event if self.r is not None else progress.event)("checkpoint_loaded",
                                                                  step=checkpoint.get("global_step"))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for k in list(self._spans):
            self._close(k)
