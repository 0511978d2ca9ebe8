#!/usr/bin/env python3
"""Data-parallel jobs that stop making progress, and jobs slowed by a known factor, for the job
verdict's stall detectors and its sensitivity table.

    torchrun --standalone --nproc-per-node N benches/workloads/stall.py MODE [options]
    RANK=r LOCAL_RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        python3 benches/workloads/stall.py MODE ...      (ranks started one by one, no launcher)

Each step: compute, then all-reduce 256 MiB of gradients, then read the loss back.

Modes:
  steady       every rank the same steps until --seconds pass (or a signal: the harness stops
               or kills a rank from outside)
  hang         like steady; --after S seconds in, rank --rank stops calling the all-reduce and
               sleeps (no CPU): its peers wait inside the collective for it
  checkpoint   like steady; --after S seconds in, rank --rank spends --pause seconds on the host
               (writing a checkpoint-sized file again and again, with CPU work between), then
               goes on: its peers wait in the next all-reduce
  slow         rank --rank does --factor times the matmuls of the others (40 a step for them)
  resnet       timm ResNet-50 training under DDP (batch 64, channels-last bf16 autocast); rank
               --rank runs --factor times the micro-batches of the others (10 a step for them,
               gradients accumulated), so it does that much more work each step

--subgroup adds a second communicator (ranks 0 and 1) with a small all-reduce each step.
--ready FILE: rank 0 touches it once every rank has warmed up. Keeps NCCL_NVLS_ENABLE=0 and the
other multicast switches the host sets.
"""
import argparse
import os
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MATMUL = 8192
BASE_MATMULS = 40
GRAD_BYTES = 256 << 20
BASE_MICRO = 10


def host_work(seconds, rank):
    """What a rank-0 checkpoint does on the host: serialise and write, again and again."""
    state = torch.randn(64 << 20)  # 256 MiB of fp32 "weights" on the CPU
    path = f"/tmp/stall-checkpoint-{os.getpid()}.pt"
    end = time.time() + seconds
    writes = 0
    while time.time() < end:
        torch.save({"w": state, "step": writes}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        state.mul_(1.0001)
        writes += 1
    os.unlink(path)
    print(f"rank {rank}: checkpoint wrote {writes} times in {seconds:.0f} s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["steady", "hang", "checkpoint", "slow", "resnet"])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--after", type=float, default=10.0)
    p.add_argument("--pause", type=float, default=60.0)
    p.add_argument("--factor", type=float, default=1.0)
    p.add_argument("--subgroup", action="store_true")
    p.add_argument("--ready", default=None)
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    odd = args.rank if args.rank is not None else world - 1
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    pair = dist.new_group([0, 1]) if args.subgroup and world >= 2 else None
    small = torch.ones(1 << 20, device=dev)

    grads = torch.zeros(GRAD_BYTES // 2, device=dev, dtype=torch.bfloat16)
    if args.mode == "resnet":
        import timm
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = timm.create_model("resnet50", num_classes=1000).to(dev)
        model = model.to(memory_format=torch.channels_last)
        ddp = DDP(model, device_ids=[local])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (64,), device=dev)
        micro = round(BASE_MICRO * (args.factor if rank == odd else 1.0))

        def step():
            opt.zero_grad(set_to_none=True)
            for i in range(micro):
                last = i == micro - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                    loss.backward()
            opt.step()
            return loss
    else:
        a = torch.randn(MATMUL, MATMUL, device=dev, dtype=torch.bfloat16)
        matmuls = BASE_MATMULS
        if args.mode == "slow" and rank == odd:
            matmuls = round(BASE_MATMULS * args.factor)

        def step():
            for _ in range(matmuls):
                b = a @ a
            del b
            dist.all_reduce(grads)
            return grads[:1].float().sum()

    def full_step():
        loss = step()
        if pair is not None and rank < 2:
            dist.all_reduce(small, group=pair)
        loss.item()  # the loss read back each step, as a training loop logs it

    for _ in range(3):
        full_step()
    dist.barrier()
    if rank == 0 and args.ready:
        open(args.ready, "w").close()
    t0 = time.time()
    end = t0 + args.seconds
    steps = 0
    odd_done = False
    while True:
        now = time.time()
        if rank == odd and not odd_done and now - t0 >= args.after:
            if args.mode == "hang":
                print(f"rank {rank}: stops calling the all-reduce after {steps} steps", flush=True)
                while True:
                    time.sleep(3600)
            if args.mode == "checkpoint":
                host_work(args.pause, rank)
                odd_done = True
        full_step()
        steps += 1
        # Every rank stops after the same step, decided by rank 0's clock.
        flag = torch.tensor([1 if time.time() < end else 0], device=dev)
        dist.broadcast(flag, 0)
        if flag.item() == 0:
            break
    elapsed = time.time() - t0
    if rank == 0:
        print(f"{args.mode}: world {world}, odd rank {odd}, factor {args.factor}, {steps} steps, "
              f"{elapsed / max(steps, 1) * 1000:.1f} ms a step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
