#!/usr/bin/env python3
"""The load that made assets/demo/demo.ndjson.gz, run by assets/demo/record.sh beside
`gpudiag record` on a GPU host (H200, PyTorch with timm).

Real training in four phases (about 2 minutes), each a bottleneck gpudiag should name:

1. input-starved: ResNet-18 training in bf16 whose batches are decoded and augmented on two CPU
   threads and copied from pageable memory; the GPU waits for the host most of the time.
2. compute-bound: a transformer encoder (8 layers, d_model 2048, sequence 2048) training in bf16
   with AdamW; the tensor cores are busy.
3. a leak: the same training, keeping a slice of each step's output "for logging"; a slice is a
   view, so it keeps the whole 64 MiB output alive, and memory grows by about 250 MiB/s.
4. parked: the process keeps all its memory and launches nothing, as a notebook left open does.

The process then exits; the recording ends a few seconds later with the GPU free.
"""
import os
import sys
import time

import timm
import torch
import torch.nn.functional as F

DEV = torch.device("cuda")


def phase(name, seconds):
    print(f"{time.strftime('%H:%M:%S')} {name} for {seconds} s", flush=True)
    return time.monotonic() + seconds


def input_starved(seconds):
    """ResNet-18 steps fed by a CPU loader that cannot keep up."""
    torch.set_num_threads(2)
    model = timm.create_model("resnet18", num_classes=1000).to(DEV).to(
        memory_format=torch.channels_last
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    raw = torch.randint(0, 256, (128, 3, 256, 256), dtype=torch.uint8)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    end = phase("input-starved ResNet-18 training (CPU loader, pageable copies)", seconds)
    while time.monotonic() < end:
        # The loader: random crop, flip and normalise on the host, then a pageable copy.
        y0, x0 = torch.randint(0, 32, (2,)).tolist()
        batch = raw[:, :, y0 : y0 + 224, x0 : x0 + 224].float()
        batch = torch.flip(batch, dims=[3]).sub_(mean).div_(std)
        labels = torch.randint(0, 1000, (128,))
        x = batch.to(DEV).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), labels.to(DEV))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    del model, opt


def transformer():
    layer = torch.nn.TransformerEncoderLayer(
        d_model=2048, nhead=16, dim_feedforward=8192, batch_first=True, norm_first=True
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False)
    model = model.to(DEV, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return model, opt


def train(model, opt, seconds, name, keep=None):
    x = torch.randn(8, 2048, 2048, device=DEV, dtype=torch.bfloat16)
    end = phase(name, seconds)
    while time.monotonic() < end:
        out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if keep is not None:
            # "Logging" the first token of the output: the view keeps all 64 MiB of it alive.
            keep.append(out.detach()[:, 0])
        torch.cuda.synchronize()


def main():
    ready = sys.argv[1] if len(sys.argv) > 1 else None
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.zeros(1, device=DEV)
    model, opt = transformer()
    if ready:
        # The recorder starts once the process holds the GPU, so the first tick shows it.
        open(ready, "w").close()
        time.sleep(1.0)
    input_starved(25)
    train(model, opt, 35, "compute-bound transformer training (bf16, tensor cores)")
    kept = []
    train(model, opt, 30, "the same training, keeping a view of each output (a leak)", kept)
    end = phase("parked: all memory held, nothing launched", 25)
    while time.monotonic() < end:
        time.sleep(0.1)
    print(f"done; kept {len(kept)} outputs", flush=True)


if __name__ == "__main__":
    main()
