"""A run's Python environment: one hash-locked set of packages, resolved once at prepare for the
nodes' platform, installed exactly on every node, every rerun and every image.

    lock.py      resolve dlinfra's node extras, the run's wheel and `training.requirements` into
                 a lock (uv, with sha256 hashes), per flavor (the CPU or the GPU build of TF)
    venvs.py     local nodes run in a venv made from the lock (content-addressed, from uv's cache)
    installed.py what a node really runs, checked against its lock (drift fails the run at once)
"""
