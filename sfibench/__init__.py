"""sfibench: measure Slow-Fast Inference against dense and eviction baselines on one decode engine."""

__version__ = "0.1.0"
