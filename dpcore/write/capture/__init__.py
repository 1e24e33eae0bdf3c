"""What is captured and written: the collective/message log, torch.profiler capture, memory
sampling, the run writer and the merged Chrome trace. Uses runtime/ only.
"""
