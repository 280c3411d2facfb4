"""Quantized checkpoints: Quark configs, the MXFP4 format reference and MXFP4 Linear layers."""
