"""Hugging Face ``transformers`` Trainer callback for ``gpufleet.progress`` (docs/progress.md).

    Trainer(..., callbacks=[GpufleetProgress()])

Reports every optimizer step (``state.global_step``; tokens from ``num_input_tokens_seen`` when
the Trainer counts them), the time from the Trainer's construction to the first step as
``init``, and checkpoint saves and evaluations as events (the Trainer has no hook before them,
so their time is in the next step's; a documented limit). Imported only here."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gpufleet import progress


class GpufleetProgress(TrainerCallback):  # type: ignore[misc]  # transformers may be absent: a subclass of Any
    def __init__(self, reporter: progress.Reporter | None = None, flops_per_step: float | None = None) -> None:
        self.r = reporter
        self.flops = flops_per_step
        self._init: Any = None
        self._tokens_seen = 0

    def _call(self, name: str, *a: Any, **kw: Any) -> Any:
        return getattr(self.r if self.r is not None else progress, name)(*a, **kw)

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._init = self._call("span", "init")
        self._init.__enter__()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        params = sum(p.numel() for p in model.parameters()) if model is not None else None
        self._call("init", rank=args.process_index, world_size=args.world_size, flops_per_step=self.flops,
                   params=params)
        if self._init is not None:
            self._init.__exit__(None, None, None)
            self._init = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        tokens = seen - self._tokens_seen if seen else None
        self._tokens_seen = seen
        self._call("step", state.global_step, tokens=tokens,
                   samples=args.per_device_train_batch_size * args.gradient_accumulation_steps)

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._call("event", "checkpoint_saved", step=state.global_step)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kw: Any) -> None:
        self._call("event", "evaluated", step=state.global_step,
                   **{k: v for k, v in (metrics or {}).items() if isinstance(v, int | float)})
