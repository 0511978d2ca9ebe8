"""Allocate 8 GiB and wait: idle_holding_memory."""
import time

import torch
from common import DEV, SECONDS

held = torch.empty(8 * 1024**3, dtype=torch.uint8, device=DEV)
torch.cuda.synchronize()
time.sleep(SECONDS)
