"""The model: checkpoints and their preparation, config, weights, the layer-wise runner, RoPE."""
