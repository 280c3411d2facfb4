"""The MoE routing alone (triton.moe.routing.group_by_expert: count, place, tile table) at a prefill's pairs, timed
in a CUDA graph: 26B-A4B's 128 experts, top 8, each tile size the layer uses there.

    PYTHONPATH=. python bench/moe_routing.py [--tokens 512,2048]
"""
import argparse

import torch

from atomlite.model_ops.triton.moe.routing import group_by_expert
from decode_attention import graph_us  # bench/ is on the path when a bench script runs

EXPERTS, TOP_K = 128, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="512,2048")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    for tokens in (int(t) for t in args.tokens.split(",")):
        ids = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOP_K] for _ in range(tokens)]).to(torch.int32)
        for block_m in (32, 64, 128):
            us = graph_us(lambda: group_by_expert(ids, EXPERTS, block_m))
            print(f"{tokens} tokens ({tokens * TOP_K} pairs), block_m {block_m}: {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
