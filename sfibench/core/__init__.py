"""The bottom layer every other package may import: errors, profiler labels, device, provenance and
tensor parallelism's process group.

Nothing here imports another sfibench package, so any module can use these without creating a cycle.
"""
