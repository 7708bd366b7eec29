"""A real GPU training loop (a GPT-style decoder on random tokens, bf16 autocast, AdamW) that
reports its progress through ``gpufleet.progress`` and writes what it measures about itself
(``--truth``, JSON lines), so gpufleet's ETTR, badput and MFU can be compared with the job's own
clock and its own FLOP count.

    python examples/progress/train_gpu.py --seconds 60 --truth truth.jsonl   # needs CUDA
    python examples/progress/train_gpu.py --device cpu --layers 2 --hidden 256 --seq 128 --seconds 10

FLOPs per step are counted by PyTorch's ``FlopCounterMode`` over one real step (forward and
backward), not estimated from the parameter count; the script reports that figure to gpufleet
and writes it to the truth file, with the 6 x params x tokens estimate beside it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

T_START = time.time()

from truth_log import Truth  # noqa: E402  (beside this script)

from gpufleet import progress  # noqa: E402

progress.init()


def build(torch: Any, a: argparse.Namespace) -> tuple[Any, Any, int]:
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(a.hidden, a.heads, dim_feedforward=4 * a.hidden, dropout=0.0,
                                       batch_first=True, norm_first=True)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.hidden)
            self.blocks = nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False)
            self.head = nn.Linear(a.hidden, a.vocab, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(a.seq), persistent=False)

        def forward(self, x: Any) -> Any:
            return self.head(self.blocks(self.emb(x), mask=self.mask, is_causal=True))

    model = Decoder().to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=a.device == "cuda")
    return model, opt, sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=60.0, help="train this long (then checkpoint and stop)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--ckpt-every-s", type=float, default=20.0)
    ap.add_argument("--ckpt-dir", default="/tmp/gf-train-gpu")
    ap.add_argument("--data-wait-s", type=float, default=0.0, help="input latency added per step")
    ap.add_argument("--truth")
    a = ap.parse_args()
    truth = Truth(a.truth, T_START)

    with truth.span("init"):
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        torch.manual_seed(0)
        model, opt, params = build(torch, a)
        amp = torch.autocast(a.device, dtype=torch.bfloat16)
        tokens_per_step = a.batch * a.seq

        def batch() -> tuple[Any, Any]:
            x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)
            return x[:, :-1], x[:, 1:]

        def train_step(x: Any, y: Any) -> Any:
            with amp:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

    # Step 1 warms up kernels and is counted: FLOPs of forward + backward, as executed.
    with truth.span("compile"):
        x, y = batch()
        with FlopCounterMode(display=False) as fc:
            train_step(x, y).item()
        flops = float(fc.get_total_flops())
    progress.init(flops_per_step=flops, params=params)
    truth.log(ev="model", params=params, tokens_per_step=tokens_per_step, flops_per_step=flops,
              flops_6nd=6.0 * params * tokens_per_step, device=a.device,
              gpu=torch.cuda.get_device_name(0) if a.device == "cuda" else None)
    progress.step(1, tokens=tokens_per_step, samples=a.batch)

    Path(a.ckpt_dir).mkdir(parents=True, exist_ok=True)
    step, end, last_ckpt = 1, time.time() + a.seconds, time.time()
    while time.time() < end:
        with truth.span("data_wait"):
            x, y = batch()
            if a.data_wait_s:
                time.sleep(a.data_wait_s)
        t0 = time.time()
        step += 1
        loss = train_step(x, y).item()  # .item() waits for the GPU: t1 is when the step really ended
        progress.step(step, tokens=tokens_per_step, samples=a.batch)
        truth.log(ev="step", step=step, t0=t0, t1=time.time(), loss=round(loss, 4))
        if time.time() - last_ckpt >= a.ckpt_every_s:
            with truth.span("checkpoint_save", step=step):
                path = Path(a.ckpt_dir) / "ckpt.pt"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           path.with_suffix(".tmp"))
                os.replace(path.with_suffix(".tmp"), path)
            last_ckpt = time.time()
    truth.log(ev="end", t=time.time(), steps=step)
    progress.shutdown()
    truth.log(ev="exit", t=time.time())


if __name__ == "__main__":
    main()
