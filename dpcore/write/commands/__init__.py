"""The write wing's commands: `profile` (and the per-rank body of one profile job), `allreduce`,
`verify`, and `dpcore.record` with the hooks it attaches to a user's loop.

A command may use runtime/, capture/, training/ and dp/; nothing below imports a command.
"""
