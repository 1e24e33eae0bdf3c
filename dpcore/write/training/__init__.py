"""The workload and the training step: built-in models, a user's `--model MODULE:FUNCTION`, and the
Trainer that times one optimizer step of any DP variant.
"""
