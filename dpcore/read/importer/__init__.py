"""`dpcore import`: foreign torch.profiler traces into a run directory (rows.py turns events into
rows, pure; write_run.py writes the run).
"""
