"""How the loop's tf.functions keep dlinfra's own code out of AutoGraph.

AutoGraph converts every function a traced function calls, unless told not to: it reads the
function's source, rewrites it, writes the result to a file and imports it, 30-200 ms a function.
Every run's first step waits for that trace. The parameter-server loop's first trace converted nine
functions of ours: 0.7 s of its 1.3 s, and the steps' `for` over `tf.range` another 0.2 s
(BENCHMARKS.md, "AutoGraph"). None of our functions has Python control flow on tensors, the one
thing conversion is for, and the step loops are `tf.while_loop`s written out.

So a loop's tf.functions take `autograph=Objective.user_code`: off, unless the loss is the program's
own callable, whose Python control flow on tensors may need it (as a hand-written loop's would be
converted). Then our helpers that the conversion would reach are wrapped here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def plain(function: F) -> F:
    """`function` as written when a converted tf.function calls it, and whatever it calls."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(function)
