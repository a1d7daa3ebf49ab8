"""`python -m dlinfra`: the CLI. A node the local target starts this way may be asked to load it, and
its node modules, in a nicer thread (node.niceness: a serving node, so that the chief starts first)."""

import importlib

from dlinfra.node.niceness import in_nicer_thread, start_niceness

if niceness := start_niceness():
    in_nicer_thread(
        lambda: [importlib.import_module(m) for m in ("dlinfra.cli.app", "dlinfra.node.beacon")],
        niceness,
        "node-load",
    )

from dlinfra.cli.app import main

main()
