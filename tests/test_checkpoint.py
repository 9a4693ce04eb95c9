"""Checkpoints: exact round trip, averaging, incomplete directories, the exported model."""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import logging
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SHALLOW

from nmt.models import model_dir
from nmt.rundir import checkpoints as checkpoint
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.training.saving import CheckpointWriter
from nmt.training.stopping import PausableClock, StopSignal
from transformer.config import SearchConfig, get_preset
from transformer.training import (
    OptimizerConfig,
    create_train_state,
    make_mesh,
    make_optimizer,
    make_train_step,
)

# Bookkeeping of saved arrays: one layer each side saves, restores and compiles less.
CONFIG = get_preset("tiny", vocab_size=67, **SHALLOW)


def _batch(seed: int, rows: int = 4, length: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, CONFIG.vocab_size, size=(rows, length + 1)).astype(np.int32)
    tokens[:, -2:] = 0
    return {"src": tokens[:, 1:], "tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}


@functools.lru_cache(maxsize=1)
def _states() -> list:
    """Train states after 0, 1, 2 and 3 updates (compiled once for the whole module)."""
    mesh = make_mesh()
    optimizer_config = OptimizerConfig(warmup_steps=3)
    graphdef, _, state = create_train_state(CONFIG, optimizer_config, mesh)
    step_fn = make_train_step(graphdef, optimizer_config, mesh)
    states = [jax.device_get(state)]
    for i in range(3):
        state, _ = step_fn(state, _batch(i))
        states.append(jax.device_get(state))
    return states


def _trained_state(steps: int):
    return _states()[steps]


def _split(state):
    return state.params, {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_exact(tmp_path):
    state = _trained_state(3)
    params, train = _split(state)
    data = {"iterator": {"epoch": 1, "position": 17}, "best_score": 3.5}
    saver = checkpoint.Checkpointer(tmp_path, keep_last=2)
    saver.save(3, params, train, data)
    saver.wait()
    saver.close()

    fresh = _trained_state(0)
    params_like, train_like = _split(fresh)
    restored = checkpoint.Checkpointer(tmp_path).restore(params_like, train_like)
    assert restored.step == 3
    assert restored.data == data
    _assert_trees_equal(restored.params, params)
    _assert_trees_equal(restored.train, train)
    assert int(restored.train["step"]) == 3


def test_keeps_last_k_and_the_newest_best(tmp_path):
    """The trainer saves to best/ only when BLEU improves, so best/ keeps the newest save."""
    params, train = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=2)
    for step, bleu in ((1, 5.0), (2, 9.0), (3, 7.0), (4, 8.0)):
        saver.save(step, params, train, {})
    for step, bleu in ((1, 5.0), (2, 9.0)):
        saver.save_best(step, params, {"bleu": bleu, "step": step})
    saver.wait()
    assert saver.steps() == [3, 4]
    assert checkpoint.complete_steps(tmp_path / checkpoint.BEST_DIR) == [2]
    saver.close()


def test_an_interim_step_stops_counting_once_a_later_step_is_saved(tmp_path):
    """A step saved because the run stopped (a signal) stays the newest until the resumed run
    saves again; then the last `keep_last` are the steps an uninterrupted run keeps."""
    params, train = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=2)
    for step in (10, 20):
        saver.save(step, params, train, {})
    saver.save(23, params, train, {}, interim=True)
    saver.wait()
    assert saver.steps() == [10, 20, 23]  # the newest is kept too: the run resumes from it
    assert (tmp_path / "checkpoints" / "23" / checkpoint.INTERIM_FILE).exists()
    saver.close()

    resumed = checkpoint.Checkpointer(tmp_path, keep_last=2)
    resumed.save(30, params, train, {})
    resumed.wait()
    assert resumed.steps() == [20, 30]
    # Saved again at the same step on schedule, a step is no longer interim.
    resumed.save(35, params, train, {}, interim=True)
    resumed.save(35, params, train, {})
    resumed.save(40, params, train, {})
    resumed.wait()
    assert resumed.steps() == [35, 40]
    assert not (tmp_path / "checkpoints" / "35" / checkpoint.INTERIM_FILE).exists()
    resumed.close()


def test_keep_last_counts_only_the_save_every_steps(tmp_path):
    """Steps saved for a best score (interim) neither push the --save-every checkpoints out
    of --keep-last nor stay once a later step is saved; the newest stays, whatever it is."""
    params, train = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=3)
    for step in range(5, 70, 5):  # every 20 on schedule, each one between for a best score
        saver.save(step, params, train, {}, interim=step % 20 != 0)
    saver._last.wait_until_finished()  # orbax's own deletion, before our seal
    assert saver.steps() == [20, 40, 60, 65]
    saver.save(80, params, train, {})
    saver.wait()
    assert saver.steps() == [40, 60, 80]
    saver.close()


def test_an_interim_step_stays_interim_when_the_process_dies_before_sealing_it(tmp_path):
    """A best-score step whose process is killed before the next save has no INTERIM file
    yet: the run resumed from it must still count it out of --keep-last."""
    params, train = _split(_trained_state(0))
    killed = checkpoint.Checkpointer(tmp_path, keep_last=2)
    for step, interim in ((20, False), (40, False), (50, True)):
        killed.save(step, params, train, {}, interim=interim)
    killed._last.wait_until_finished()
    killed._last.close(), killed._best.close()  # no seal: as if killed here
    resumed = checkpoint.Checkpointer(tmp_path, keep_last=2)
    resumed.save(60, params, train, {})
    resumed.wait()
    assert resumed.steps() == [40, 60]
    resumed.close()
    assert not list((tmp_path / "checkpoints").glob("interim-*"))


def test_a_run_without_interim_steps_deletes_the_oldest_as_soon_as_a_save_is_final(tmp_path):
    """Not at the next save: a run never holds more than --keep-last finished steps."""
    params, train = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        saver.save(step, params, train, {})
    saver._last.wait_until_finished()  # orbax's own wait: nothing of ours has run since
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                  if p.name.isdigit()) == [2, 3]
    saver.close()


def test_with_keep_last_1_an_interim_step_goes_only_once_the_next_is_sealed(tmp_path,
                                                                             monkeypatch):
    params, train = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=1, async_save=False)
    saver.save(20, params, train, {})
    saver.save(23, params, train, {}, interim=True)
    saver.wait()
    assert saver.steps() == [20, 23]  # the last of the schedule, and the newest
    saver.close()
    # The resumed run: its next save fails after orbax finalized it (sealing it does not).
    resumed = checkpoint.Checkpointer(tmp_path, keep_last=1, async_save=False)
    monkeypatch.setattr(checkpoint, "write_checksums",
                        lambda step_dir: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(checkpoint.SaveError):
        resumed.save(40, params, train, {})
        resumed.wait()
    assert 23 in resumed.steps()
    resumed.close()


def test_discard_best_keeps_only_the_recorded_step(tmp_path):
    params, _ = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(tmp_path)
    saver.save_best(2, params, {"bleu": 1.0, "step": 2})
    saver.wait()
    (tmp_path / checkpoint.BEST_DIR / "6").mkdir()  # a leftover that orbax does not list
    assert saver.discard_best(keep=2) == [6]
    assert saver.best_step() == 2
    assert saver.discard_best(keep=None) == [2]
    assert saver.best_step() is None and not list((tmp_path / checkpoint.BEST_DIR).iterdir())
    saver.close()


def _saved_as_best_and_checkpoint(run_dir: Path):
    """(a Checkpointer, the parameters it saved as step 2 in checkpoints/ and best/, a tree
    of the same shapes to restore into)."""
    params, train = _split(_trained_state(2))
    params_like, _ = _split(_trained_state(0))
    saver = checkpoint.Checkpointer(run_dir)
    saver.save(2, params, train, {})
    saver.save_best(2, params, {"ppl": 9.0, "step": 2})
    saver.wait()
    return saver, params, params_like


def test_a_damaged_or_missing_best_step_is_read_from_its_checkpoint(tmp_path, caplog):
    """checkpoints/<best step> holds best/<step>'s parameters: a damaged best/ loses nothing
    while it is kept, at export (`restore_params`) and on resume, which writes best/ again."""
    from nmt.rundir import resume

    saver, params, params_like = _saved_as_best_and_checkpoint(tmp_path)
    best = tmp_path / checkpoint.BEST_DIR / "2"
    for victim in (best / "params" / "d").iterdir():
        with victim.open("r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    _assert_trees_equal(saver.restore_params(params_like, 2, best=True), params)
    assert f"{best} is damaged" in caplog.text and "checkpoints/2, which holds" in caplog.text
    book = Bookkeeping(best_metric="ppl", best_score=9.0, best_step=2)
    resume._check_best_directory(book, saver, 2, params_like)
    saver.wait()
    assert book.best_step == 2 and checkpoint.unusable(best) is None
    _assert_trees_equal(saver.restore_params(params_like, 2, best=True), params)
    shutil.rmtree(best)
    shutil.rmtree(tmp_path / checkpoint.CHECKPOINTS_DIR / "2")
    with pytest.raises(checkpoint.CheckpointError, match=r"best/2 is missing, and .*checkpoints/2"
                       r", which holds the same parameters, is missing: delete"):
        saver.restore_params(params_like, 2, best=True)
    saver.close()


def _damage(step_dir: Path) -> None:
    for victim in (step_dir / "params" / "d").iterdir():
        with victim.open("r+b") as f:
            f.truncate(victim.stat().st_size // 2)


def test_a_lost_best_step_is_written_again_from_the_model_that_holds_it(tmp_path, caplog):
    """best/<step> damaged and checkpoints/<step> gone (--keep-last deleted it): model/, whose
    config.json records that step and score, holds its parameters, so the best and model/
    stay that step. Were model/ another step, the best starts afresh from the validation of
    the step resumed from, as the warning says."""
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from nmt.rundir import resume

    saver, params, params_like = _saved_as_best_and_checkpoint(tmp_path)
    texts = [f"sentence number {i} with some words {i * 7}" for i in range(300)]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300, model_type="bpe"))
    model = tmp_path / model_dir.MODEL_DIR
    model_dir.export_model(model, params, CONFIG, tokenizer, None,
                           {"step": 2, "ppl": 9.0, "chosen": "best validation perplexity"})
    best = tmp_path / checkpoint.BEST_DIR / "2"
    _damage(best)
    shutil.rmtree(tmp_path / checkpoint.CHECKPOINTS_DIR / "2")
    current = jax.device_put(params_like)  # the parameters of the step resumed from, 3
    book = Bookkeeping(best_metric="ppl", best_score=9.0, best_step=2,
                       last_eval={"step": 3, "ppl": 12.0})
    resume._check_best_directory(book, saver, 3, current)
    saver.wait()
    assert (book.best_step, book.best_score) == (2, 9.0) and checkpoint.unusable(best) is None
    _assert_trees_equal(saver.restore_params(params_like, 2, best=True), params)
    assert f"writing best step 2 again from {model}" in caplog.text

    _damage(best)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "step": 1}))
    resume._check_best_directory(book, saver, 3, current)
    saver.wait()
    assert (book.best_step, book.best_score) == (3, 12.0) and saver.best_step() == 3
    _assert_trees_equal(saver.restore_params(params_like, 3, best=True), params_like)
    assert ("and model/ does not hold that step; tracking the best perplexity afresh, starting "
            "from the validation of step 3") in caplog.text
    saver.close()


def test_the_best_step_is_hashed_once_where_it_is_read(tmp_path, monkeypatch):
    """Reading best/<step>, or checkpoints/<step> in its place, verifies each one's
    checksums once (a big model's checkpoint takes seconds to hash), not once to choose it
    and again to read it."""
    saver, params, params_like = _saved_as_best_and_checkpoint(tmp_path)
    hashed = []
    real = checkpoint.damaged_file
    monkeypatch.setattr(checkpoint, "damaged_file",
                        lambda step_dir: hashed.append(step_dir.parent.name) or real(step_dir))
    _assert_trees_equal(saver.restore_params(params_like, 2, best=True), params)
    assert hashed == [checkpoint.BEST_DIR]
    shutil.rmtree(tmp_path / checkpoint.BEST_DIR / "2")
    hashed.clear()
    _assert_trees_equal(saver.restore_params(params_like, 2, best=True), params)
    assert hashed == [checkpoint.CHECKPOINTS_DIR]
    saver.close()


def _save_trained_states(run_dir: Path, steps: list[int]) -> list:
    """Checkpoints of `_trained_state(n)` at each step n."""
    saver = checkpoint.Checkpointer(run_dir, keep_last=5)
    states = [_trained_state(n) for n in steps]
    for n, state in zip(steps, states):
        saver.save(n, *_split(state), {})
    saver.wait()
    saver.close()
    return states


def _assert_mean_of(mean, a, b) -> None:
    expected = jax.tree.map(lambda x, y: (np.asarray(x) + np.asarray(y)) / 2, a.params, b.params)
    for x, y in zip(jax.tree.leaves(mean), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-6, atol=1e-7)


def test_average_is_mean_of_last_n(tmp_path, caplog):
    states = _save_trained_states(tmp_path, [1, 2, 3])
    caplog.clear()
    with caplog.at_level(logging.INFO):
        mean, steps = checkpoint.average_checkpoints(tmp_path, 2, CONFIG)
    assert steps == [2, 3]
    _assert_mean_of(mean, states[1], states[2])
    # restoring read-only is not a warning a user should have to interpret
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_average_of_fewer_checkpoints_than_asked_is_their_mean(tmp_path, caplog):
    """Guards --average-last N with fewer than N checkpoints on disk: the mean of those there
    (divided by their number, not by N, which would shrink every parameter). The shortfall is
    warned of once, by the export (`final_model.fewer_than_asked`), not here as well."""
    states = _save_trained_states(tmp_path, [1, 2])
    caplog.clear()
    with caplog.at_level(logging.INFO):
        mean, steps = checkpoint.average_checkpoints(tmp_path, 5, CONFIG)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert steps == [1, 2]
    _assert_mean_of(mean, states[0], states[1])


def test_a_short_average_says_whether_checkpoints_were_left_out_as_damaged():
    """Fewer checkpoints averaged than --average-last asked for: a run that saved no more,
    or one whose damaged checkpoints were skipped, which the warning must not call absent."""
    from nmt.rundir.final_model import fewer_than_asked

    assert fewer_than_asked([2, 3], 2, 3) is None
    assert fewer_than_asked([2, 3], 3, 2).endswith("the run has no more complete ones")
    assert fewer_than_asked([2, 3], 3, 3).endswith(
        "1 more were left out as damaged or unreadable (the warnings above name them)")


def test_a_full_disk_at_the_export_says_what_running_again_does(tmp_path, monkeypatch):
    """The same advice fits a training run and --average-only, which trains nothing."""
    from nmt.rundir import final_model

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(final_model, "export_model", full)
    with pytest.raises(checkpoint.SaveError) as raised:
        final_model._export(tmp_path / "averaged")
    assert str(raised.value).endswith(
        "then run the same command again, which writes averaged/ from the checkpoints.")


def test_an_unreadable_checkpoint_is_left_out_of_the_average_for_the_one_before(tmp_path,
                                                                                caplog):
    """A step damaged without checksums to tell (written by an earlier version, or its
    SHA256SUMS gone) is skipped with a warning, as resume skips it."""
    states = _save_trained_states(tmp_path, [1, 2, 3])
    newest = tmp_path / checkpoint.CHECKPOINTS_DIR / "3"
    (newest / checkpoint.CHECKSUMS_FILE).unlink()
    for victim in (newest / "params" / "d").iterdir():
        with victim.open("r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    mean, steps = checkpoint.average_checkpoints(tmp_path, 2, CONFIG)
    assert steps == [1, 2] and f"not averaging unreadable checkpoint {newest}" in caplog.text
    _assert_mean_of(mean, states[0], states[1])


def test_averaging_with_another_model_names_the_step_and_the_settings(tmp_path):
    _save_trained_states(tmp_path, [1, 2])
    wider = dataclasses.replace(CONFIG, d_model=CONFIG.d_model + 6)
    step = re.escape(str(tmp_path.absolute() / checkpoint.CHECKPOINTS_DIR / "2"))
    with pytest.raises(checkpoint.CheckpointError,
                       match=rf"^{step}: an array of the model is .* in the checkpoint: the model"
                             r" of RUN/config.yaml is not the one the run trained; give"):
        checkpoint.average_checkpoints(tmp_path, 2, wider, "RUN/config.yaml")


def test_incomplete_checkpoints_are_ignored_on_restore(tmp_path):
    state = _trained_state(1)
    params, train = _split(state)
    saver = checkpoint.Checkpointer(tmp_path, keep_last=5)
    saver.save(1, params, train, {"iterator": {"epoch": 0, "position": 1}})
    saver.wait()
    saver.close()
    root = tmp_path / checkpoint.CHECKPOINTS_DIR
    # An interrupted orbax save: the temporary directory that would have become 5/.
    shutil.copytree(root / "1", root / "5.orbax-checkpoint-tmp-1234")
    # A partially copied step: no finalization metadata.
    shutil.copytree(root / "1", root / "7")
    (root / "7" / "_CHECKPOINT_METADATA").unlink()
    # Steps finalized, but with an item directory gone: every item orbax lists must be there.
    for step, item in ((9, "train"), (11, "data")):
        shutil.copytree(root / "1", root / str(step))
        shutil.rmtree(root / str(step) / item)
    # A complete step whose arrays cannot be read: skipped in favour of the one before.
    shutil.copytree(root / "1", root / "13")
    (root / "13" / "train" / "_METADATA").write_text("{damaged")
    assert checkpoint.complete_steps(root) == [1, 13]

    params_like, train_like = _split(_trained_state(0))
    restored = checkpoint.Checkpointer(tmp_path).restore(params_like, train_like)
    assert restored.step == 1
    assert restored.data == {"iterator": {"epoch": 0, "position": 1}}
    _assert_trees_equal(restored.params, params)


def test_resumes_when_clipping_or_weight_decay_is_turned_on(tmp_path):
    """--clip-norm and --weight-decay do not change the optimizer state's structure."""
    params, train = _split(_trained_state(2))  # trained without clipping or decay
    saver = checkpoint.Checkpointer(tmp_path)
    saver.save(2, params, train, {"best_score": 1.0})
    saver.wait()
    saver.close()
    for changed in ({"clip_norm": 1.0}, {"weight_decay": 0.01}):
        optimizer = make_optimizer(OptimizerConfig(warmup_steps=3, **changed), CONFIG.d_model)
        train_like = {**train, "opt_state": jax.eval_shape(optimizer.init, params)}
        restored = checkpoint.Checkpointer(tmp_path).restore(params, train_like)
        assert restored is not None and restored.step == 2, changed
        assert int(restored.train["step"]) == 2
        _assert_trees_equal(restored.train["opt_state"], train["opt_state"])


def test_checkpoints_that_cannot_be_restored_are_an_error(tmp_path):
    """Complete checkpoints that all fail to restore must not let the run start over."""
    params, train = _split(_trained_state(1))
    saver = checkpoint.Checkpointer(tmp_path)
    saver.save(1, params, train, {})
    saver.save(2, params, train, {})
    saver.wait()
    saver.close()
    other = {**train, "opt_state": (train["opt_state"], np.zeros(3, np.float32))}
    root = re.escape(str(tmp_path / checkpoint.CHECKPOINTS_DIR))
    with pytest.raises(checkpoint.CheckpointError,
                       match=rf"{root}: none of the complete checkpoints \(steps \[1, 2\]\).*"
                             r"step 2: .*--output-dir.*delete"):
        checkpoint.Checkpointer(tmp_path).restore(params, other)
    assert checkpoint.Checkpointer(tmp_path / "empty").restore(params, train) is None


def test_checkpoints_of_another_model_shape_name_the_shapes_and_the_settings(tmp_path):
    """A model flag changed on resume: orbax's advice on its own API is not passed on."""
    params, train = _split(_trained_state(1))
    saver = checkpoint.Checkpointer(tmp_path)
    saver.save(1, params, train, {})
    saver.wait()
    saver.close()
    wider = jax.tree.map(lambda leaf: jnp.zeros((*leaf.shape[:-1], leaf.shape[-1] + 2),
                                               leaf.dtype), params)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.Checkpointer(tmp_path).restore(wider, train)
    message = str(raised.value)
    assert "the model's shapes differ from those of its checkpoints (steps [1]; an array" in message
    shape = r"\(\d+(, \d+)*,?\)"
    assert re.search(rf"is {shape} now and {shape} in the checkpoint", message), message
    assert "give the same ones again" in message and "strict" not in message


def test_export_and_load_model(tmp_path):
    from data.tokenizer import TokenizerConfig, train_tokenizer

    texts = [f"sentence number {i} with some words {i * 7}" for i in range(300)]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300, model_type="bpe"))
    config = dataclasses.replace(CONFIG, vocab_size=tokenizer.vocab_size)
    mesh = make_mesh()
    _, _, state = create_train_state(config, OptimizerConfig(), mesh)
    exported = model_dir.export_model(tmp_path / "run" / "model", state.params, config,
                                      tokenizer, SearchConfig(beam_size=2),
                                        {"source_lang": "en", "target_lang": "de"})
    model, loaded_tokenizer, values = model_dir.load_model(tmp_path / "run")
    assert exported == tmp_path / "run" / "model"
    assert values["model"] == config
    assert values["search"].beam_size == 2
    assert values["source_lang"] == "en"
    assert loaded_tokenizer.encode(["sentence"]) == tokenizer.encode(["sentence"])
    from flax import nnx
    _assert_trees_equal(nnx.state(model, nnx.Param), state.params)

    (exported / model_dir.PARAMS_FILE).unlink()
    with pytest.raises(model_dir.ModelDirError, match="params.msgpack"):
        model_dir.load_model(exported)
    with pytest.raises(model_dir.ModelDirError, match="does not exist"):
        model_dir.load_model(tmp_path / "nowhere")


def test_abstract_model_is_the_model_eval_shape_builds_and_tracers_keep_their_probe():
    """The fast abstract build gives what a plain `nnx.eval_shape` gives, and leaves JAX's
    tracers as they were."""
    import jax.core
    from flax import nnx

    from transformer.model import Transformer

    config = get_preset("tiny", vocab_size=67, share_embeddings=False)
    probe = jax.core.Tracer.__dict__["sharding"]
    graphdef, params, rest = model_dir.abstract_params(config)
    assert jax.core.Tracer.__dict__["sharding"] is probe
    plain = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    plain_graphdef, plain_params, plain_rest = nnx.split(plain, nnx.Param, ...)
    assert graphdef == plain_graphdef
    assert jax.tree.structure(params) == jax.tree.structure(plain_params)
    assert ([(p.shape, p.dtype) for p in jax.tree.leaves(params)]
            == [(p.shape, p.dtype) for p in jax.tree.leaves(plain_params)])
    assert jax.tree.structure(rest) == jax.tree.structure(plain_rest)

    def probed(x):
        return getattr(x, "sharding", "none")
    assert jax.jit(lambda x: (probed(x) == "none", x))(np.ones(2))[0]  # the probe still answers


def test_saving_a_step_again_replaces_it(tmp_path):
    """After resuming from an earlier step, the run reaches (and saves) the same steps again."""
    params0, train0 = _split(_trained_state(0))
    params1, train1 = _split(_trained_state(1))
    saver = checkpoint.Checkpointer(tmp_path, keep_last=3)
    saver.save(4, params0, train0, {"run": 1})
    saver.save_best(4, params0, {"bleu": 1.0})
    saver.wait()
    (tmp_path / checkpoint.CHECKPOINTS_DIR / "6").mkdir()  # an unreadable leftover
    saver.save(4, params1, train1, {"run": 2})
    saver.save(6, params1, train1, {"run": 2})
    saver.save_best(4, params1, {"bleu": 2.0})
    saver.wait()
    restored = saver.restore(params0, train0, step=4)
    assert restored.data == {"run": 2}
    _assert_trees_equal(restored.params, params1)
    assert saver.steps() == [4, 6]
    saver.close()


_KILLED_DURING_SAVE = """
import os, sys
import numpy as np
sys.path.insert(0, {repo!r})
from nmt.rundir import checkpoints as checkpoint
from nmt.models import model_dir
saver = checkpoint.Checkpointer({run!r}, keep_last=5)
params = {{"w": np.ones((4, 4), np.float32)}}
train = {{"step": np.array(1, np.int32), "opt_state": np.zeros(3, np.float32),
         "rng": np.zeros(2, np.uint32)}}
saver.save(1, params, train, {{"ok": True}})
saver.wait()
big = {{"w": np.ones((4, 4), np.float32), "pad": np.ones((64, 1024, 1024), np.float32)}}
saver.save(2, big, train, {{"ok": False}})
os._exit(1)  # killed while step 2 is being written in the background
"""


def test_process_killed_during_async_save_leaves_no_readable_step(tmp_path):
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[1])
    script = _KILLED_DURING_SAVE.format(repo=repo, run=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    leftovers = [p.name for p in (tmp_path / checkpoint.CHECKPOINTS_DIR).iterdir()]
    assert any(name.startswith("2.orbax-checkpoint-tmp") for name in leftovers), leftovers
    assert checkpoint.complete_steps(tmp_path / checkpoint.CHECKPOINTS_DIR) == [1]
    import numpy as np

    params_like = {"w": np.zeros((4, 4), np.float32)}
    train_like = {"step": np.array(0, np.int32), "opt_state": np.zeros(3, np.float32),
                  "rng": np.zeros(2, np.uint32)}
    restored = checkpoint.Checkpointer(tmp_path).restore(params_like, train_like)
    assert restored.step == 1 and restored.data == {"ok": True}


@pytest.mark.parametrize("text, what", [
    ("{bad", "JSONDecodeError"),
    ('{"model": {"d_model": 32, "bogus": 1}}', "bogus"),
    (json.dumps({"model": {**get_preset("tiny").to_dict(), "dtype": "float16"}}), "dtype"),
    ("[1, 2]", "no 'model' section"),
])
def test_damaged_model_config_is_named(tmp_path, text, what):
    (tmp_path / model_dir.CONFIG_FILE).write_text(text)
    with pytest.raises(model_dir.ModelDirError) as info:
        model_dir.read_model_config(tmp_path)
    assert str(tmp_path / model_dir.CONFIG_FILE) in str(info.value)
    assert what in str(info.value)


class _RecordedSaves:
    """A Checkpointer that records which steps were saved as interim."""

    def __init__(self):
        self.interim: dict[int, bool] = {}

    def save(self, step, params, train, data, interim) -> None:
        self.interim[step] = interim

    def wait(self) -> None:
        pass


@pytest.mark.parametrize("step, at_stop, interim", [
    (0, True, True), (7, True, True), (10, True, False), (20, False, False), (15, False, True)])
def test_a_save_is_interim_unless_the_schedule_saves_its_step(step, at_stop, interim):
    """Step 0 (Ctrl-C before the first update) is no scheduled save, though 0 % N == 0:
    a resumed run must neither keep nor average its untrained parameters. A step saved for
    its best score (15) does not count in --keep-last either: best/ keeps its parameters."""
    saves = _RecordedSaves()
    state = type("State", (), {"params": {}, "step": step, "opt_state": {}, "rng": None})()
    writer = CheckpointWriter(saves, None, StopSignal(), PausableClock(), interval=10)
    writer.save(step, state, Bookkeeping(), at_stop=at_stop)
    assert saves.interim == {step: interim}
