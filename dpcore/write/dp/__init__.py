"""Data-parallel machinery, one feature in one place: the variants (one module each, one
interface), the from-scratch all-reduce algorithms, sharding, the ZeRO-1 optimizer and FSDP units.
"""
