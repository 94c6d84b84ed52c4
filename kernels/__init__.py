"""Triton kernels (shipped as ``quantize_cli.kernels``). Nothing here imports Triton at import time."""
