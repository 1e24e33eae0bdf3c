"""What is captured and written: the collective/message log, torch.profiler capture, memory
sampling, the run writer, a run's life cycle (shared by every command that writes a run) and
the merged Chrome trace. Uses runtime/ only.
"""
