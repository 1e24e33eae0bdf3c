"""The write wing: runs data-parallel jobs and writes run directories (torch; never pandas).

Layers, lowest first (a module imports only its own layer or lower ones):
runtime -> capture -> dp -> training -> commands.
"""
