"""Integrations that run atomlite's models and kernels inside other serving engines (vllm/)."""
