"""A user program with a bug: fails while building, as real user code does."""


def build(training):  # noqa: ANN001, ANN201
    raise ValueError("user bug: no such column 'pixels'")
