"""rlpost: JAX-native reinforcement-learning post-training."""

__version__ = "0.1.0"
