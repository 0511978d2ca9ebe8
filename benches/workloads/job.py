#!/usr/bin/env python3
"""Multi-GPU jobs with a known shape, for the job verdict: one process a GPU under torchrun.

    torchrun --standalone --nproc-per-node N benches/workloads/job.py MODE [--seconds S]
             [--slow-rank R] [--ready FILE]

Modes (each step: compute, then the collective a data-parallel job makes):
  balanced     every rank does the same matmuls, then all-reduces 512 MiB of gradients
  slow13       rank R does 1.3x the matmuls of the others
  slow105      rank R does 25 matmuls where the others do 24 (1.04x): a straggler the NCCL
               shares barely show, for the order of arrivals at the collectives
  slow2        rank R does 2x the matmuls of the others
  cpu_starved  every rank prepares its batch on the CPU (numpy) before the step; rank R's
               core is shared with three busy processes, so it prepares 3-4x slower
  shared       balanced, while a second process outside the job runs matmuls on rank R's GPU
  comm         a small matmul, then all-reduces 1 GiB: the GPUs mostly exchange data
  pipeline     N stages of unequal size (stage 0 holds the most parameters and does the most
               work); micro-batches pass stage to stage with send/recv

benches/workloads/ddp_spawn.py runs the same steps under `torch.multiprocessing.spawn`.

The first rank touches FILE (--ready) once every rank has warmed up, so a recorder starts on
steady steps. Keeps NCCL_NVLS_ENABLE=0 and the other multicast switches the host sets.
"""
import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MATMUL = 8192
STEP_MATMULS = 24  # about 35 ms of bf16 tensor-core work on an H100
GRAD_BYTES = 512 << 20
COMM_BYTES = 1 << 30


def hog_cpu(core):
    """A busy loop pinned to one core, in its own process."""
    code = (
        "import os\n"
        f"os.sched_setaffinity(0, {{{core}}})\n"
        "while True:\n    pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def hog_gpu(device, seconds):
    """Matmuls on one GPU from a process outside the job (no torchrun variables)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_WORLD_SIZE")
           and not k.startswith("TORCHELASTIC_")}
    code = (
        "import time, torch\n"
        f"torch.cuda.set_device({device})\n"
        f"a = torch.randn({MATMUL}, {MATMUL}, device='cuda', dtype=torch.bfloat16)\n"
        f"end = time.time() + {seconds}\n"
        "while time.time() < end:\n"
        "    for _ in range(8):\n"
        "        b = a @ a\n"
        "    torch.cuda.synchronize()\n"
    )
    # start_new_session: its parent is not the rank, as a second user's job would not be.
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)


def prepare_batch(rng):
    """CPU work a data loader does in the training process: about 15 ms on a free core."""
    x = rng.standard_normal(400_000)
    x.sort()
    return x[:1024]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--ready", default=None)
    args = p.parse_args(argv)

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    slow = args.slow_rank if args.slow_rank is not None else world // 2
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    dev = torch.device("cuda", local)

    hogs = []
    if args.mode == "cpu_starved":
        # Each rank on a core of its own; the slow rank's core shared with three busy loops.
        core = 2 + rank
        os.sched_setaffinity(0, {core})
        torch.set_num_threads(1)
        if rank == slow:
            hogs = [hog_cpu(core) for _ in range(3)]
    if args.mode == "shared" and rank == slow:
        hogs.append(hog_gpu(local, args.seconds + 10))

    a = torch.randn(MATMUL, MATMUL, device=dev, dtype=torch.bfloat16)
    grads = torch.zeros(GRAD_BYTES // 2, device=dev, dtype=torch.bfloat16)
    matmuls = STEP_MATMULS
    if args.mode == "slow13" and rank == slow:
        matmuls = round(STEP_MATMULS * 1.3)
    if args.mode == "slow105" and rank == slow:
        matmuls = STEP_MATMULS + 1
    if args.mode == "slow2" and rank == slow:
        matmuls = STEP_MATMULS * 2
    rng = np.random.default_rng(rank)

    if args.mode == "pipeline":
        # Stage s holds (world - s) x 4 GiB of parameters and does (world - s) units of work.
        params = torch.empty((world - rank) * (4 << 30), dtype=torch.uint8, device=dev)
        params.fill_(1)
        units = world - rank
        act = torch.zeros(32 << 20, dtype=torch.bfloat16, device=dev)
        small = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def step():
        if args.mode == "pipeline":
            for _ in range(4):  # micro-batches
                if rank > 0:
                    dist.recv(act, src=rank - 1)
                for _ in range(units * 8):
                    small @ small
                if rank < world - 1:
                    dist.send(act, dst=rank + 1)
            dist.barrier()
            return
        if args.mode == "cpu_starved":
            batch = torch.from_numpy(prepare_batch(rng)).to(dev, non_blocking=False)
            del batch
        if args.mode == "comm":
            b = a[:1024, :1024] @ a[:1024, :1024]
            del b
            buf = comm_buf
        else:
            for _ in range(matmuls):
                b = a @ a
            buf = grads
        dist.all_reduce(buf)
        torch.cuda.synchronize()  # the loss read back each step, as a training loop logs it

    comm_buf = torch.zeros(COMM_BYTES // 2, device=dev, dtype=torch.bfloat16) \
        if args.mode == "comm" else None

    for _ in range(5):
        step()
    dist.barrier()
    if rank == 0 and args.ready:
        open(args.ready, "w").close()
    end = time.time() + args.seconds
    steps = 0
    t0 = time.time()
    while True:
        step()
        steps += 1
        # Every rank stops after the same step, decided by rank 0's clock.
        flag = torch.tensor([1 if time.time() < end else 0], device=dev)
        dist.broadcast(flag, 0)
        if flag.item() == 0:
            break
    elapsed = time.time() - t0
    if rank == 0:
        print(f"{args.mode}: world {world}, slow rank {slow}, {steps} steps, "
              f"{elapsed / steps * 1000:.1f} ms a step", flush=True)
    for h in hogs:
        h.kill()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
