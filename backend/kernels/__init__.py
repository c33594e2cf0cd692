"""Triton kernels behind checked wrappers; each wrapper module also holds the torch reference.

Importing this package never imports triton: the ``_*_triton`` modules are loaded by the wrappers
on first use, so a machine without triton (or without a GPU) still imports the model.

Every dot asks for ``input_precision="ieee"``: fp32 operands (an fp32 model on a GPU) are
multiplied exactly, as torch multiplies fp32 by default, not in TF32; bf16 and FP8 operands
run on the tensor cores either way.
"""
