"""The compiled search programs of a model graph, made once per graph, the graph closed over.

jit hashes its static arguments at every call, and hashing a GraphDef walks every node of the
model, as merging the model to read its config does: too slow for every small batch. So each
graph gets its own jitted functions (`GraphPrograms`), which take the model's state as an
argument and have two small static arguments: the strategy (`transformer.strategies`) and
the output positions. Searching with new parameters (after a training step) compiles
nothing; equal graphs (a model loaded again) share one `GraphPrograms` and so their compiled
programs.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable

import jax
from flax import nnx

from transformer.config import ModelConfig
from transformer.search.beam import beam_outputs, beam_state, beam_steps
from transformer.search.greedy import greedy_outputs, greedy_state, greedy_steps
from transformer.search.step import encode_sources, model_step
from transformer.stored import StoredJit, stable_repr
from transformer.strategies import Beam, Greedy, Sample, Strategy


@dataclasses.dataclass(frozen=True)
class Loop:
    """A strategy's search as compiled programs, and how its hypotheses reach the host.

    start:   (strategy, max_len, state, src [batch, width], limits [batch])
             -> (EncodedSources, search state before the first step)
    resume:  (strategy, max_len, state, EncodedSources, search state, stop_at [], rng,
             candidates [K] or None) -> search state, after steps until every sentence is
             done, the positions run out, or no more than `stop_at` sentences search (its
             state argument is donated; with candidates, a shortlist: `model_step`)
    outputs: (search state, pad_id, nbest) -> host tokens, scores and lengths
    """

    start: StoredJit
    resume: StoredJit
    outputs: Callable


class GraphPrograms:
    """The jitted search loops and any other program (`jitted`) of one model graph."""

    def __init__(self, graphdef: nnx.GraphDef, state: nnx.State):
        self.graphdef = graphdef
        self.model_config: ModelConfig = nnx.merge(graphdef, state).config
        greedy = Loop(self._jit(_greedy_start, static_args=2),
                      self._jit(_greedy_resume, static_args=2, donate_argnums=(4,)),
                      greedy_outputs)
        beam = Loop(self._jit(_beam_start, static_args=2),
                    self._jit(_beam_resume, static_args=2, donate_argnums=(4,)),
                    beam_outputs)
        self._loops: dict[type, Loop] = {Greedy: greedy, Sample: greedy, Beam: beam}
        self._others: dict[Callable, StoredJit] = {}
        self._lock = threading.Lock()

    def loop(self, strategy: Strategy) -> Loop:
        return self._loops[type(strategy)]

    def jitted(self, fn: Callable) -> StoredJit:
        """`fn(graphdef, *args)` jitted as a function of args, made on first use."""
        program = self._others.get(fn)
        if program is None:
            with self._lock:
                program = self._others.setdefault(fn, self._jit(fn))
        return program

    def _jit(self, fn: Callable, **jit_options) -> StoredJit:
        """jax.jit of `fn(graphdef, *args)`, named as fn (compile logs and the compilation
        cache's file names say which program it is), kept on disk where `transformer.stored`
        is told where."""
        graphdef = self.graphdef

        def with_graph(*args):
            return fn(graphdef, *args)
        with_graph.__name__ = with_graph.__qualname__ = fn.__name__
        return StoredJit(with_graph, identity=lambda: stable_repr(graphdef), **jit_options)


def _greedy_start(graphdef, strategy: Greedy | Sample, max_len: int, state, src, limits):
    model = nnx.merge(graphdef, state)
    sources = encode_sources(model, src, limits)
    cache = model.init_cache(sources.memory, max_len)
    return sources, greedy_state(cache, src.shape[0], max_len, model.config)


def _greedy_resume(graphdef, strategy: Greedy | Sample, max_len: int, state, sources,
                   loop_state, stop_at, rng, candidates):
    model = nnx.merge(graphdef, state)
    return greedy_steps(model_step(model, sources, candidates), loop_state, strategy,
                        model.config, sources.limits, max_len, stop_at, rng)


def _beam_start(graphdef, strategy: Beam, max_len: int, state, src, limits):
    # The start is an encoder only: the first step, from BOS, runs in the loop like every
    # other, so no decoder step is compiled twice.
    model = nnx.merge(graphdef, state)
    sources = encode_sources(model, src, limits)
    cache = model.init_cache(sources.memory, max_len, beam_size=strategy.size)
    return sources, beam_state(cache, src.shape[0], strategy.size, max_len, model.config)


def _beam_resume(graphdef, strategy: Beam, max_len: int, state, sources, loop_state, stop_at,
                 rng, candidates):
    del rng  # beam search draws nothing
    model = nnx.merge(graphdef, state)
    return beam_steps(model_step(model, sources, candidates), loop_state, strategy,
                      model.config, sources.limits, max_len, stop_at)


# Graphs seen lately, by identity (a dict lookup per call) and by equality (a reloaded model
# finds its compiled programs); a process that loads many models keeps the newest few.
_KEPT = 32
_by_id: collections.OrderedDict[int, tuple[nnx.GraphDef, GraphPrograms]] = \
    collections.OrderedDict()
_by_graph: collections.OrderedDict[nnx.GraphDef, GraphPrograms] = collections.OrderedDict()
_lock = threading.Lock()


def forget_programs() -> None:
    """Drop every graph's compiled programs, for a process that measures many models in turn:
    each compiled program holds memory maps of its machine code, and a process has a limit
    on those (vm.max_map_count)."""
    with _lock:
        _by_id.clear()
        _by_graph.clear()
    jax.clear_caches()


def programs_for(graphdef: nnx.GraphDef, state: nnx.State) -> GraphPrograms:
    """The `GraphPrograms` of `graphdef` (made on first use; any thread)."""
    seen = _by_id.get(id(graphdef))
    if seen is not None and seen[0] is graphdef:
        return seen[1]
    with _lock:
        programs = _by_graph.get(graphdef)
        if programs is None:
            programs = _by_graph[graphdef] = GraphPrograms(graphdef, state)
        _by_graph.move_to_end(graphdef)
        _by_id[id(graphdef)] = (graphdef, programs)
        for kept in (_by_id, _by_graph):
            while len(kept) > _KEPT:
                kept.popitem(last=False)
    return programs
