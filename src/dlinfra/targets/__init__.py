"""Targets differ only in how nodes are started and addressed; the renderer and agent are shared."""
