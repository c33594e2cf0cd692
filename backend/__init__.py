"""The DeepSeek-V3.1 engine: `model/` (config, checkpoint, layers), `text/` (tokenizer, chat
template, parsers), `engine/` (scheduler, blocks, runner, sampler, MTP, the async engine),
`kernels/` (Triton) and `native/` (C) with their torch references, and `parallel/` (tensor and
expert parallel ranks); `plan`, `generate` and the demo checkpoints are commands.

Imports neither `gateway`, `providers` nor `plumbing`: it knows nothing of HTTP or Redis."""
