"""rlkit: an algorithm-research toolkit for RL on large language models."""

__version__ = "0.1.0"
