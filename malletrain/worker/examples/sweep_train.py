"""A sweep's trial, written for ``torchrun``: a small MLP whose ``--lr`` and ``--width`` a search chooses.

    torchrun --nnodes=1:2 --nproc-per-node=1 -m malletrain.worker.examples.sweep_train --lr 0.01 --width 16 \\
        --ckpt ckpt/0

A plain DDP script (``init_process_group("env://")``, gloo on CPU) on the synthetic regression set of
:mod:`malletrain.worker.examples.torchrun_ddp`, with its own checkpoint in the folder ``--ckpt`` (model,
optimizer, step, data position) every ``--checkpoint-every`` steps: restarted at any world size (a
recall, a node back) it resumes there. Rank 0 appends one line a start to ``CKPT/starts.log``
(``start STEP world W trained T``: T is the last step an earlier run trained, so a start at step 0
with T > 0 is a start from scratch that lost training), reports the training loss every
10 steps (:func:`malletrain.worker.client.trial_report`, for a sweep's pruner) and, at the end, its value,
the validation loss (:func:`malletrain.worker.client.trial_result`: ``{"value": X}`` into the file
``MALLETRAIN_TRIAL_RESULT`` names). Outside a sweep those calls do nothing. See docs/training.md,
"Sweeps", and ``malletrain/worker/examples/sweep.toml``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from malletrain.worker.client import trial_report, trial_result
from malletrain.worker.examples.torchrun_ddp import FEATURES, SEED, loader_from, make_dataset, save_checkpoint

VALIDATION = 512


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lr", type=float, required=True, help="the learning rate (a sweep's float)")
    p.add_argument("--width", type=int, required=True, help="hidden units (a sweep's int)")
    p.add_argument("--ckpt", type=Path, required=True, help="the trial's checkpoint folder")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps in all (then the value, exit 0)")
    p.add_argument("--batch", type=int, default=8, help="samples one rank trains per step")
    p.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend work per step")
    return p.parse_args()


def validation_loss(model: torch.nn.Module) -> float:
    g = torch.Generator().manual_seed(SEED + 99)
    x = torch.randn(VALIDATION, FEATURES, generator=g)
    data = make_dataset()
    w = torch.linalg.lstsq(data.tensors[0], data.tensors[1]).solution  # the set's true weights
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), x @ w))


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ckpt = args.ckpt / "ckpt.pt"
    step, epoch, position = 0, 0, 0
    if ckpt.exists():  # restarted: resume from the trial's own checkpoint
        state = torch.load(ckpt, weights_only=True)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, epoch, position = int(state["step"]), int(state["epoch"]), int(state["position"])
    trained = args.ckpt / "trained"  # the last step any run of this trial trained (rank 0)
    if rank == 0:
        args.ckpt.mkdir(parents=True, exist_ok=True)
        before = int(trained.read_text() or 0) if trained.exists() else 0
        with open(args.ckpt / "starts.log", "a") as fh:
            fh.write(f"start {step} world {world} trained {before} t {time.time():.3f}\n")
    dataset = make_dataset()

    def save() -> None:
        save_checkpoint(ckpt, {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step,
                               "epoch": epoch, "position": position})

    while step < args.steps:
        for x, y in loader_from(dataset, epoch, position, args.batch):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            position += args.batch * world
            print(f"step {step} world {world} rank {rank} loss {loss.item():.5f}", flush=True)
            if rank == 0:
                trained.write_text(str(max(step, int(trained.read_text() or 0) if trained.exists() else 0)))
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if rank == 0 and step % args.checkpoint_every == 0:
                save()
            if rank == 0 and step % 10 == 0:
                trial_report(step, loss.item())
            if step >= args.steps:
                break
        else:
            epoch, position = epoch + 1, 0
    if rank == 0:
        save()
        value = validation_loss(net)
        print(f"value {value:.6f}", flush=True)
        trial_result(value)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
