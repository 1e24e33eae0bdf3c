"""The contract wing: what the write and read wings must agree on (run format, config names,
metric and interval definitions). Standard library, numpy and orjson only.
"""
