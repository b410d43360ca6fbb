"""How much of a cache the engine works on at once, where the memory estimate (metrics/memory.py) plans
for the transient it makes; a module of its own so the estimate runs before torch is imported."""

NORM_CHUNK = 8192  # cached keys whose float32 norms a synthetic prefill computes at once (engine/synthetic.py)
