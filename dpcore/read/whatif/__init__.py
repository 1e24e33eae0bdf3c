"""The what-if model: replay a measured step at other bucket sizes, world sizes and networks
(model.py the pure replay, fit.py what it measures from a run, predict.py the tables).
"""
