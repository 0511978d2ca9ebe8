#!/usr/bin/env python3
"""benches/workloads/job.py's steps in the shape of the PyTorch DDP tutorial: one python parent
starts a process a GPU with `torch.multiprocessing.spawn`, and each child sets MASTER_ADDR,
MASTER_PORT and its RANK in os.environ only after it has started.

    python3 benches/workloads/ddp_spawn.py N MODE [job.py's options]

So nothing in the children's /proc/PID/environ names the job (the kernel shows the environment
a process started with, not what it set since), and no launcher started them: only their
command lines (`... --multiprocessing-fork`, readable by anyone) say they are the parent's
workers. Modes and options are job.py's (slow2 with --slow-rank R: rank R does twice the work).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.multiprocessing as mp  # noqa: E402

import job  # noqa: E402

# The tutorial's address and port.
MASTER_ADDR = "localhost"
MASTER_PORT = "12355"


def worker(rank, world, argv):
    # What the tutorial's setup() does, plus the variables job.py reads.
    os.environ["MASTER_ADDR"] = MASTER_ADDR
    os.environ["MASTER_PORT"] = MASTER_PORT
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    job.main(argv)


def main():
    world = int(sys.argv[1])
    argv = sys.argv[2:]
    mp.spawn(worker, args=(world, argv), nprocs=world, join=True)


if __name__ == "__main__":
    main()
