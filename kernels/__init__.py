"""idlm_kernels: Triton kernels for the ISD hot paths, each beside its PyTorch reference.

The reference (`<op>_ref`) is the CPU path and the test oracle; `idlm_kernels.ops`
chooses the backend once.
"""
