"""Quantized checkpoint formats: Quark configs and the MXFP4 format reference, in plain torch. The layers that run
MXFP4 kernels (and re-lay weights out for them at load) live in model_ops; nothing here imports it."""
