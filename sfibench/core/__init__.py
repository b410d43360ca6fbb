"""The bottom layer every other package may import: errors, profiler labels, device and provenance.

Nothing here imports another sfibench package, so any module can use these without creating a cycle.
"""
