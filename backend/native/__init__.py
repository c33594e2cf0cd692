"""C kernels for the CPU decode path, compiled at run time with the system compiler.

Each wrapper checks its inputs and returns None when the kernel does not apply (no compiler, a
dtype or shape it does not cover); the caller then runs the torch path, which stays the oracle.
"""
