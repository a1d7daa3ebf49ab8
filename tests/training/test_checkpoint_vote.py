"""The mirrored workers' vote on a checkpoint asked for on any one of them (a spot notice, the
budget's watchdog): a collective, so every worker saves at the same step. Run for real under the
mirrored strategies a run uses, on this machine's CPU (one worker: TF_CONFIG unset)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from dlinfra.training.loop import _any_worker


@pytest.mark.parametrize(
    "strategy",
    [tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy],
    ids=["mirrored", "multi_worker_mirrored"],
)
def test_a_checkpoint_asked_for_on_one_worker_is_voted_by_all(strategy: type) -> None:
    made = strategy()
    assert _any_worker(made, True) is True
    assert _any_worker(made, False) is False
