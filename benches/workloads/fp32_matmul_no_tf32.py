"""FP32 matmuls with TF32 off: compute_bound on the FP32 pipes, tensor cores idle (advice: TF32
or bf16)."""
import torch
from common import DEV, loop

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
a = torch.randn(8192, 8192, device=DEV)
b = torch.randn(8192, 8192, device=DEV)


def step():
    torch.mm(a, b)
    torch.cuda.synchronize()


loop(step)
