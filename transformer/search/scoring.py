"""Force decoding: the log-probability a model gives a reference, with no search (fairseq's
--score-reference, marian-scorer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer.model import Transformer
from transformer.search.programs import programs_for

if TYPE_CHECKING:
    from transformer.ensemble import Ensemble

Array = jax.Array


def reference_logprobs(model: Transformer | Ensemble, src_ids: np.ndarray | Array,
                       tgt_ids: np.ndarray | Array) -> np.ndarray:
    """log p(reference | source) of each row, teacher-forced.

    src_ids [batch, src_len] and tgt_ids [batch, tgt_len] are padded with PAD and end with
    EOS (tgt_ids without BOS); returns float32 [batch], the sum of the log-probabilities of
    every target token, EOS included. Nothing is banned here: a reference is scored as it is.
    """
    graphdef, state = nnx.split(model)
    return reference_logprobs_with_state(graphdef, state, src_ids, tgt_ids)


def reference_logprobs_with_state(graphdef: nnx.GraphDef, state: nnx.State,
                                  src_ids: np.ndarray | Array, tgt_ids: np.ndarray | Array
                                  ) -> np.ndarray:
    """`reference_logprobs` for a model already split with `nnx.split`."""
    score = programs_for(graphdef, state).jitted(_reference_logprobs)
    return np.asarray(score(state, jnp.asarray(src_ids, jnp.int32),
                            jnp.asarray(tgt_ids, jnp.int32)))


def _reference_logprobs(graphdef, state, src, tgt):
    """log p(tgt | src) [batch] of src [batch, src_len] and tgt [batch, tgt_len] (no BOS)."""
    model = nnx.merge(graphdef, state)
    config = model.config
    tgt_in = jnp.concatenate([jnp.full((tgt.shape[0], 1), config.bos_id, jnp.int32),
                              tgt[:, :-1]], axis=1)
    # An ensemble returns log-probabilities already; log_softmax leaves them unchanged.
    logprobs = jax.nn.log_softmax(model(src, tgt_in), axis=-1)  # [batch, tgt_len, vocab]
    picked = jnp.take_along_axis(logprobs, tgt[..., None], axis=-1)[..., 0]
    return jnp.where(tgt != config.pad_id, picked, 0.0).sum(axis=1)
