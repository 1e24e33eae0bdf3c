"""Reading torch.profiler Chrome traces: files and ranks, the byte scanner that turns a trace into
columns, and what each event counts as (compute, comm, ...). No metric lives here.
"""
