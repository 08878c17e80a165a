"""Functional kernels and their plain PyTorch references (torch + optional triton only)."""
