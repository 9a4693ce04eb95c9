"""Faults injected into the trainer from tests, in place of production settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import nmt.training.trainer


def poison_parameters_before(monkeypatch, step: int, factor: float = jnp.nan) -> None:
    """Multiply every parameter by `factor` just before update `step` (1-based): NaN, as a
    diverging run would make them, or a large factor, as a loss spike follows. The trainer
    must notice at its next read-back and stop."""
    train_one_step = nmt.training.trainer.Trainer._train_one_step

    def poisoned(self):
        if self.step + 1 == step:
            self.state = self.state.replace(
                params=jax.tree.map(lambda x: x * factor, self.state.params))
        return train_one_step(self)

    monkeypatch.setattr(nmt.training.trainer.Trainer, "_train_one_step", poisoned)
