import os

import torch

# Triton fixes interpreter mode at its first import: decide before anything imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
