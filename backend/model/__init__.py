"""The DeepSeek-V3.1 model: config, checkpoint loading, layers, MLA, MoE, the paged latent cache."""
