"""A plain DDP training script written for ``torchrun``: nothing in it knows malletrain.

    torchrun --nnodes=1:4 --nproc-per-node=1 -m malletrain.worker.examples.torchrun_ddp --steps 200 \\
        --checkpoint /tmp/ddp.pt

It is what a user brings: ``init_process_group("env://")`` (torchrun's variables), a tiny model
built in code, a synthetic data set sharded with ``DistributedSampler``, and its own checkpoint
every ``--checkpoint-every`` steps (model, optimizer, step, and the data position: the epoch
and how many of its samples the whole world has trained). Restarted, at any world size, it
resumes from that checkpoint: the epoch's remaining samples, in the same order, are sharded
over the new world. It ends, exit 0, after ``--steps`` optimizer steps.

Each step prints one line to stdout (``step S world W rank R restart C t UNIXTIME``: the restart
count is ``TORCHELASTIC_RESTART_COUNT``), so a log shows which world trained which step, and when.

Run under malletrain with ``launcher = "torchrun"`` (see docs/training.md); ``--batch`` is the
samples one rank trains per step (give the job file the same ``worker_batch``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

DATASET_SIZE = 4096
FEATURES = 16
SEED = 1234


def make_dataset() -> TensorDataset:
    """A fixed synthetic regression set (the same on every rank and at every restart)."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(DATASET_SIZE, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return TensorDataset(x, x @ w + 0.01 * torch.randn(DATASET_SIZE, 1, generator=g))


def epoch_order(epoch: int) -> list[int]:
    """The epoch's sample order, independent of the world size (what a restart resumes in)."""
    return torch.randperm(DATASET_SIZE, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def loader_from(dataset: TensorDataset, epoch: int, position: int, batch: int) -> DataLoader:
    """This rank's batches of the epoch's samples from ``position`` on, sharded by DistributedSampler."""
    rest = Subset(dataset, epoch_order(epoch)[position:])
    sampler = DistributedSampler(rest, shuffle=False, drop_last=True)
    return DataLoader(rest, batch_size=batch, sampler=sampler, drop_last=True)


def save_checkpoint(path: Path, state: dict) -> None:
    """Written beside, then renamed over the old one: a stop mid-write leaves the old one whole."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps to train in all (then exit 0)")
    p.add_argument("--batch", type=int, default=8, help="samples one rank trains per step")
    p.add_argument("--checkpoint", type=Path, default=Path("torchrun_ddp.pt"), help="the checkpoint file")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend work per step")
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(SEED)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    step, epoch, position = 0, 0, 0
    if args.checkpoint.exists():  # restarted: resume from the script's own checkpoint
        ckpt = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, epoch, position = int(ckpt["step"]), int(ckpt["epoch"]), int(ckpt["position"])
    dataset = make_dataset()
    while step < args.steps:
        for x, y in loader_from(dataset, epoch, position, args.batch):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            step += 1
            position += args.batch * world
            print(f"step {step} world {world} rank {rank} restart {restart} t {time.time():.3f}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if rank == 0 and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint, {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                                                  "step": step, "epoch": epoch, "position": position})
            if step >= args.steps:
                break
        else:
            epoch, position = epoch + 1, 0
    if rank == 0:
        save_checkpoint(args.checkpoint, {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                                          "step": step, "epoch": epoch, "position": position})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
