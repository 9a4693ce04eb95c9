"""Ensembles: several trained models searched as one (fairseq's `--path a:b`, Marian's
`--models a b`).

At every search step each model scores the next token from its own encoder output and its
own decoder cache, and the ensemble's distribution is the mean of the models' probabilities:

    log p(y_t | y_<t, x) = log( (1/M) * sum_m p_m(y_t | y_<t, x) )

(fairseq's rule; Marian instead adds weighted log-probabilities). The models must share the
SentencePiece model, hence the vocabulary and the special-token ids; their sizes, depths and
dtypes may differ. `Ensemble` has the interface `transformer.search` searches over
(`config`, `encode`, `source_mask`, `init_cache`, `decode`); its cache is an
`transformer.cache.EnsembleCache` of the models' caches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from transformer.cache import EnsembleCache
from transformer.model import Transformer

Array = jax.Array

# Fields every member must agree on: they define what a token id means.
_SHARED_FIELDS = ("vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")


class Ensemble(nnx.Module):
    """Models that decode in step and average their next-token probabilities.

    `config` is the first model's, with `max_len` the smallest of the members' (no member
    can decode further than its own positions reach).
    """

    def __init__(self, models: Sequence[Transformer]):
        if len(models) < 2:
            raise ValueError(f"an ensemble needs at least two models, got {len(models)}.")
        first = models[0].config
        for i, model in enumerate(models[1:], start=1):
            for field in _SHARED_FIELDS:
                mine, theirs = getattr(model.config, field), getattr(first, field)
                if mine != theirs:
                    raise ValueError(f"model {i} has {field} {mine} but model 0 has {theirs}; "
                                     "ensembled models must share one vocabulary.")
        self.models = nnx.List(list(models))
        self.config = dataclasses.replace(
            first, max_len=min(model.config.max_len for model in models))

    def source_mask(self, src_ids: Array) -> Array:
        """[batch, src_len] -> [batch, 1, 1, src_len], False on padding (shared pad id)."""
        return self.models[0].source_mask(src_ids)

    def encode(self, src_ids: Array) -> tuple[Array, ...]:
        """[batch, src_len] ids -> one memory [batch, src_len, d_model_m] per model."""
        return tuple(model.encode(src_ids) for model in self.models)

    def init_cache(self, memory: tuple[Array, ...], max_len: int, beam_size: int = 1
                   ) -> EnsembleCache:
        """One `Transformer.init_cache` per model, over that model's memory."""
        return EnsembleCache(tuple(model.init_cache(m, max_len, beam_size)
                                   for model, m in zip(self.models, memory)))

    def decode(self, memory: tuple[Array, ...], src_mask: Array, tgt_ids: Array,
               cache: EnsembleCache | None = None, rng: Array | None = None,
               candidates: Array | None = None) -> tuple[Array, EnsembleCache | None]:
        """`Transformer.decode` of every model, combined.

        Returns (float32 [batch, tgt_len, vocab] log of the models' mean probability, the
        updated caches or None). The first output is normalised log-probabilities; search
        treats it as logits, whose log-sum-exp is then 0.
        """
        caches = cache.members if cache is not None else (None,) * len(self.models)
        logprobs, new_caches = [], []
        for model, model_memory, model_cache in zip(self.models, memory, caches):
            logits, model_cache = model.decode(model_memory, src_mask, tgt_ids, model_cache, rng,
                                               candidates)
            logprobs.append(jax.nn.log_softmax(logits, axis=-1))
            new_caches.append(model_cache)
        mean = jax.nn.logsumexp(jnp.stack(logprobs), axis=0) - math.log(len(self.models))
        return mean, (EnsembleCache(tuple(new_caches)) if cache is not None else None)

    def __call__(self, src_ids: Array, tgt_in: Array) -> Array:
        """Teacher-forced log-probabilities float32 [batch, tgt_len, vocab] (scoring)."""
        memory = self.encode(src_ids)
        return self.decode(memory, self.source_mask(src_ids), tgt_in)[0]
