"""The read wing: reads run directories and torch.profiler traces, computes metrics and draws
them (pandas, plotly, streamlit; never torch).

Layers, lowest first (a module imports only its own layer or lower ones):
traces, rundir -> analysis -> whatif, importer, report -> plots -> dashboard.
"""
