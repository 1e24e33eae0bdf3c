"""Opening run directories: run.json and the CSV tables into a `Run` (the only reader of run files).
"""
