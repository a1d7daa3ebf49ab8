"""A user program with a bug: fails while building, as real user code does."""


def build(training):
    raise ValueError("user bug: no such column 'pixels'")
