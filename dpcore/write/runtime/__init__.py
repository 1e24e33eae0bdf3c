"""How ranks run: the distributed context, spawning or joining a world (ranks spawned here,
torchrun's, or a user's own process group), cores and pinning, the cross-rank clock and
progress output. The bottom layer of the write wing.
"""
