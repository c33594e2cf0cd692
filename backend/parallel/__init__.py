"""Tensor- and expert-parallel serving over torch.distributed (NCCL on GPUs, gloo on CPUs).

``group`` wraps the process group (its backend and device; every collective with a timeout),
``layout`` says which slice of each weight a rank holds, ``layers`` are the parallel modules,
``loader`` reads a rank's slices, ``model`` is the sharded network and its step protocol,
``cluster`` starts and stops the worker ranks and ``worker`` is a worker rank's process.
"""
