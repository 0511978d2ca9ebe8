"""Keep 64 MiB more every 100 ms (about 38 GiB/min) while doing a little work: the memory.leak
finding, whatever verdict its compute earns."""
import time

import torch
from common import DEV, SECONDS

kept = []
a = torch.randn(2048, 2048, device=DEV)
end = time.monotonic() + SECONDS
while time.monotonic() < end:
    kept.append(torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=DEV))
    torch.mm(a, a)
    torch.cuda.synchronize()
    time.sleep(0.1)
