"""Command-line text, one module per command: what `analyze`, `summarize` (and profile's
end-of-run table), `stragglers`, `whatif`, `allreduce` and `import` print. The CLI only parses
arguments and prints what these return. table_text.py is the one table formatter, resolve.py the
one answer to "is this PATH a run or traces?".
"""
