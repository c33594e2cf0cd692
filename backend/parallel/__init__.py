"""Tensor- and expert-parallel serving over torch.distributed (NCCL on GPUs, gloo on CPUs), with
tensor- or data-parallel attention.

``group`` wraps the process group (its backend and device; every collective with a timeout),
``layout`` says which slice of each weight a rank holds, ``layers`` are the parallel modules,
``dp_attention`` runs each rank's attention over its own sequences and latent pool,
``loader`` reads a rank's slices, ``model`` is the sharded network and its step protocol,
``cluster`` starts and stops the worker ranks and ``worker`` is a worker rank's process;
``sizing`` and ``advice`` count what each layout holds, reads and sends (``backend.plan``).
"""
