"""Command-line text: what `analyze`, `summarize`, `stragglers` and `whatif` print (the CLI only
parses arguments and prints what these return).
"""
