"""A real PyTorch (CPU) training loop reporting its progress through ``gpufleet.progress``,
checkpointing every ``--ckpt-every`` steps and resuming from its last checkpoint after a
crash. It also writes what it measures about itself (``--truth``, JSON lines: every span and
step with its start and end) so a test can compare gpufleet's ETTR and badput with it.

    GPUFLEET_JOB_ID=demo python examples/progress/train_cpu.py --ckpt-dir /tmp/ck --steps 400

Runs under ``torchrun`` too (gloo): one progress stream per rank (RANK/WORLD_SIZE).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

T_START = time.time()  # before anything heavy: the process's own start

from truth_log import Truth  # noqa: E402  (beside this script)

from gpufleet import progress  # noqa: E402

progress.init()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--data-wait-s", type=float, default=0.004, help="simulated input latency per step")
    ap.add_argument("--ckpt-extra-s", type=float, default=0.0, help="simulated slow storage per checkpoint")
    ap.add_argument("--hang-at", type=int, default=0, help="rank 1 blocks in a collective at this step (gloo)")
    ap.add_argument("--truth")
    a = ap.parse_args()
    truth = Truth(a.truth, T_START)

    with truth.span("init"):
        import torch
        import torch.distributed as dist

        torch.manual_seed(0)
        torch.set_num_threads(1)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        if world > 1:
            dist.init_process_group("gloo")
        d = a.hidden
        model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d), torch.nn.ReLU(),
                                    torch.nn.Linear(d, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        params = sum(p.numel() for p in model.parameters())
        progress.init(params=params)
    ckpt = Path(a.ckpt_dir) / f"rank{rank}.pt"
    start = 0
    if ckpt.exists():
        with truth.span("checkpoint_load"):
            state = torch.load(ckpt)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = int(state["step"])
    truth.log(ev="resume", step=start)
    for step in range(start + 1, a.steps + 1):
        with truth.span("data_wait", step=step):
            x = torch.randn(a.batch, d)
            y = torch.randn(a.batch, 1)
            time.sleep(a.data_wait_s)
        t0 = time.time()
        if a.hang_at and step == a.hang_at and rank == 1:
            truth.log(ev="hang", t=t0, step=step)
            dist.barrier()  # its peers never reach this barrier: blocked in a collective
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        progress.step(step, tokens=a.batch, samples=a.batch)
        truth.log(ev="step", step=step, t0=t0, t1=time.time())
        if a.eval_every and step % a.eval_every == 0:
            with truth.span("eval"), torch.no_grad():
                model(torch.randn(4 * a.batch, d)).mean().item()
        if step % a.ckpt_every == 0:
            with truth.span("checkpoint_save", step=step):
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                time.sleep(a.ckpt_extra_s)
                os.replace(tmp, ckpt)
    truth.log(ev="end", t=time.time())
    progress.shutdown()
    truth.log(ev="exit", t=time.time())


if __name__ == "__main__":
    main()
