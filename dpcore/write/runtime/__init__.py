"""How ranks run: the distributed context, spawning or joining a world (local or torchrun),
cores and pinning, the cross-rank clock and progress output. The bottom layer of the write wing.
"""
