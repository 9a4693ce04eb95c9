"""A tiny Transformer learns copy-and-reverse, and search decodes held-out inputs exactly: with
JAX, and with CTranslate2 on its conversion in float32 and int8."""

import dataclasses

import jax
import numpy as np
import pytest
from conftest import compiled_to_run
from flax import nnx

from transformer.config import SearchConfig, get_preset
from transformer.search import pad_sources, search
from transformer.training import (
    OptimizerConfig,
    create_train_state,
    make_mesh,
    make_train_step,
    shard_batch,
)

PAD, BOS, EOS = 0, 2, 3
COPY, REVERSE = 4, 5  # the first source token says what to do with the rest
FIRST_SYMBOL, VOCAB = 6, 20


def task_example(rng: np.random.Generator) -> tuple[list[int], list[int]]:
    symbols = list(rng.integers(FIRST_SYMBOL, VOCAB, size=int(rng.integers(2, 8))))
    command = int(rng.choice([COPY, REVERSE]))
    target = symbols if command == COPY else symbols[::-1]
    return [command] + symbols, target


def train_batch(rng: np.random.Generator, rows: int, width: int = 10) -> dict[str, np.ndarray]:
    src = np.full((rows, width), PAD, np.int32)
    tgt_in = np.full((rows, width), PAD, np.int32)
    tgt_out = np.full((rows, width), PAD, np.int32)
    for r in range(rows):
        source, target = task_example(rng)
        src[r, : len(source) + 1] = source + [EOS]
        tgt_in[r, : len(target) + 1] = [BOS] + target
        tgt_out[r, : len(target) + 1] = target + [EOS]
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def train(state, step, mesh, rng: np.random.Generator, updates: int):
    first = shard_batch(train_batch(rng, 64), mesh)
    step = compiled_to_run(step, state, first)  # 900 updates: running, not compiling
    state, metrics = step(state, first)
    for _ in range(updates - 1):
        state, metrics = step(state, shard_batch(train_batch(rng, 64), mesh))
    return state, float(metrics["loss"])


@pytest.fixture(scope="module")
def trained_model():
    """600 updates at peak lr 3e-3, then 500 with fresh Adam at 3e-4 (annealing).

    The first phase alone plateaus at loss ~0.005-0.03 with spikes, and decoded 1-5 of 300
    held-out inputs wrong even after 1,200 updates, which of them depending on the CPU's float
    summation order. After 300 annealing updates, the loss is ~0.001 and 300 of 300 decoded
    right with each of seven training-data streams (seeds 0-6) tried; with the loss computed
    in chunks (the CPU's default), CTranslate2's int8 conversion of that model still got one
    of the 40 inputs below wrong (a repeated symbol dropped), and after 500 none.
    """
    config = get_preset("tiny", vocab_size=VOCAB, d_model=64, num_heads=4, d_ff=128,
                        dropout=0.0)
    mesh = make_mesh()
    rng = np.random.default_rng(0)
    explore = OptimizerConfig(schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=60,
                              label_smoothing=0.0)
    graphdef, rest, state = create_train_state(config, explore, mesh)
    state, _ = train(state, make_train_step(graphdef, explore, mesh), mesh, rng, 600)

    anneal = dataclasses.replace(explore, peak_lr=3e-4, warmup_steps=20)
    _, _, fresh = create_train_state(config, anneal, mesh)
    state = dataclasses.replace(fresh, params=state.params)
    state, loss = train(state, make_train_step(graphdef, anneal, mesh), mesh, rng, 500)
    assert loss < 0.01, f"did not learn the task: loss {loss}"
    return nnx.merge(graphdef, jax.device_get(state.params), rest)


@pytest.mark.parametrize("search_config", [
    SearchConfig(strategy="greedy"),
    SearchConfig(beam_size=4, alpha=0.6),
], ids=["greedy", "beam4"])
def test_trained_model_decodes_held_out_inputs_exactly(trained_model, search_config):
    rng = np.random.default_rng(12345)  # not the training stream
    pairs = [task_example(rng) for _ in range(40)]
    src = pad_sources([source + [EOS] for source, _ in pairs], PAD)
    result = search(trained_model, src, search_config)
    outputs = [result.token_ids(row, EOS) for row in range(len(pairs))]
    wrong = [(source, target, out[0]) for (source, target), out in zip(pairs, outputs)
             if out[0] != target]
    assert not wrong, f"{len(wrong)} of {len(pairs)} wrong, e.g. {wrong[:3]}"


def test_sampling_at_low_temperature_also_solves_the_task(trained_model):
    rng = np.random.default_rng(7)
    pairs = [task_example(rng) for _ in range(16)]
    src = pad_sources([source + [EOS] for source, _ in pairs], PAD)
    config = dataclasses.replace(SearchConfig(strategy="sample"), temperature=0.05)
    result = search(trained_model, src, config, rng=jax.random.key(0))
    outputs = [result.token_ids(row, EOS) for row in range(len(pairs))]
    assert [out[0] for out in outputs] == [target for _, target in pairs]


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
@pytest.mark.parametrize("search_config", [
    SearchConfig(strategy="greedy"),
    SearchConfig(beam_size=4, alpha=0.6, beam_rules="k-finished", length_penalty="power"),
], ids=["greedy", "beam4"])
def test_on_ctranslate2_it_decodes_them_too(trained_model, search_config, compute_type,
                                            tmp_path):
    """The CTranslate2 engine (nmt.engines) on the trained model's conversion, in float32 and
    in int8: every held-out input decoded right, as JAX decodes them."""
    pytest.importorskip("ctranslate2")
    from types import SimpleNamespace

    from nmt.convert.ctranslate2 import build_spec
    from nmt.engines.ctranslate2 import CTranslate2Translator

    vocabulary = ["<pad>", "<unk>", "<s>", "</s>", "<copy>", "<reverse>"] + [
        f"s{i}" for i in range(FIRST_SYMBOL, VOCAB)]
    tokenizer = SimpleNamespace(  # the pieces are the ids' names
        vocabulary=lambda: vocabulary,
        pieces=lambda ids, side="source": [vocabulary[i] for i in ids],
        decode=lambda rows: [" ".join(vocabulary[i] for i in row) for row in rows])
    spec = build_spec(nnx.to_pure_dict(nnx.state(trained_model, nnx.Param)),
                      trained_model.config, tokenizer)
    spec.optimize(quantization=compute_type)
    spec.save(str(tmp_path))
    translator = CTranslate2Translator(tmp_path, tokenizer, trained_model.config,
                                       search_config, compute_type=compute_type)
    rng = np.random.default_rng(12345)  # the held-out inputs of the test above
    pairs = [task_example(rng) for _ in range(40)]
    done = translator.translate_all(["x"] * len(pairs), ids=[source for source, _ in pairs])
    outputs = [list(nbest[0].tokens) for nbest in done.nbest]
    assert outputs == [target for _, target in pairs]
