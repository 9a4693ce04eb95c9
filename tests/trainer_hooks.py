"""Faults injected into the trainer from tests, in place of production settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import nmt.trainer


def poison_parameters_before(monkeypatch, step: int) -> None:
    """Make every parameter NaN just before update `step` (1-based), as a diverging run would
    make them: the trainer must notice at its next read-back and stop."""
    make_train_step = nmt.trainer.make_train_step

    def make_poisoned(*args, **kwargs):
        train_step = make_train_step(*args, **kwargs)

        def poisoned(state, batch):
            if int(state.step) + 1 == step:
                state = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
            return train_step(state, batch)

        return poisoned

    monkeypatch.setattr(nmt.trainer, "make_train_step", make_poisoned)
