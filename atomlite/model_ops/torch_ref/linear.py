import torch
import torch.nn.functional as F
from atomlite.model_ops.kernels import declare


def linear(x: torch.Tensor, weight: torch.Tensor, summed: bool = True) -> torch.Tensor:
    """y = x W^T: torch's GEMM (cuBLAS / hipBLASLt on a GPU). summed=False lets a linear return its output as
    PartialSums (model_ops.carriers) for a consumer that adds them; this one always returns the tensor."""
    return F.linear(x, weight)


declare("linear", "torch", linear)
