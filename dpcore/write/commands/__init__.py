"""The write wing's commands: `profile` (and the per-rank body of one profile job), `allreduce`,
`verify`, and `dpcore.record` with the hooks it attaches to a user's loop.

A command may use runtime/, capture/, training/ and dp/; nothing below imports a command, and a
command imports no other command (what two commands share, such as the run life cycle, lives in
a lower layer). A command may be split in two modules: `profile_rank` is `profile`'s per-rank
body, `record_hooks` the part of `record` that depends on the user's model.
"""
