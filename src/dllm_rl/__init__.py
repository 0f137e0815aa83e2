"""dllm-rl: reinforcement learning and SFT for diffusion language models."""

__version__ = "0.1.0"
