"""Triton kernels behind checked wrappers; each wrapper module also holds the torch reference.

Importing this package never imports triton: the ``_*_triton`` modules are loaded by the wrappers
on first use, so a machine without triton (or without a GPU) still imports the model.
"""
