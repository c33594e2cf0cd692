"""The serving engine: scheduler, blocks, sampler, runner and the step and async engines."""
