"""The trainer's bookkeeping: what a run saves, resumes from, logs and exports.

`nmt.training.trainer.train` runs in this process on the tiny preset with one layer each side
(`conftest.SHALLOW`) for a few steps. Validation BLEU is scripted: the beam search is replaced
by a stub and the scores come from a list, so each test decides which validation improves.
Runs share one JAX compilation cache (FLAX_NMT_CACHE).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import struct
import threading
import time
import types
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import pytest
from conftest import SHALLOW

import nmt.training.run_data
import nmt.training.trainer
from data.sampling import SampledEpochs
from data.tokenizer import load_tokenizer
from nmt.models import model_dir
from nmt.rundir import checkpoints as checkpoint
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.settings import recipes
from nmt.settings.config import SettingsError, TrainerConfig
from nmt.training import loader, stopping, validation
from nmt.training.metrics_log import METRICS_FILE, TB_DIR, MetricsWriter, summarize_window
from nmt.training.run_data import prepare_data
from nmt.training.summary import print_summary, scoring_command
from nmt.training.trainer import TrainingError, train
from nmt.training.validation import Validator, describe_bleu
from nmt.translation import scoring
from synthetic_corpus import syllable_sentences, write_corpus
from trainer_hooks import poison_parameters_before


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpus")
    return {"train": write_corpus(root, 400, 0, "train"),
            "valid": write_corpus(root, 12, 1, "valid"),
            "valid_long": write_corpus(root, 12, 1, "valid_long", words=(6, 12)),
            "test": write_corpus(root, 7, 2, "test")}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def bleus(monkeypatch, cache) -> list[float]:
    """The BLEU of each validation, in order; a test appends to it. Translating takes
    `bleus.translate_s` seconds (a list, one entry per validation, then 0), passed by calling
    `bleus.wait` (time.sleep unless a test gives its clock's); `bleus.settings` records the
    BLEU settings each validation scored with."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(cache))
    scores = ScriptedScores()

    class Translator:
        def __init__(self, *args, **kwargs):
            pass

        def translate(self, sources):
            if scores.translate_s:
                scores.wait(scores.translate_s.pop(0))
            return ["x"] * len(sources)

        def translate_nbest(self, sources, **where):
            return [[types.SimpleNamespace(text=text)] for text in self.translate(sources)]

    def evaluate(hyps, refs, **bleu):
        scores.settings.append(bleu)
        return types.SimpleNamespace(bleu=scores.pop(0), chrf=0.0)

    monkeypatch.setattr(validation, "Translator", Translator)
    monkeypatch.setattr(scoring, "evaluate", evaluate)
    return scores


class ScriptedScores(list):
    translate_s: list[float]
    settings: list[dict]

    def __init__(self):
        super().__init__()
        self.translate_s, self.settings = [], []
        self.wait: Callable[[float], None] = time.sleep


class ShiftedClock:
    """The monotonic clock of `nmt.training.stopping` (the run's timing), moved on by `wait`
    instead of sleeping: slow work in no time."""

    def __init__(self):
        self.shift = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.shift

    def wait(self, seconds: float) -> None:
        self.shift += seconds


def _run(corpus: dict[str, str], out: Path, **settings) -> dict:
    settings = {"preset": "tiny", "train_prefix": corpus["train"],
                "valid_prefix": corpus["valid"], "vocab_size": 320, "batch_tokens": 256,
                "buckets": (16,), "max_tokens_per_sentence": 16, "warmup": 20, "log_every": 3,
                "eval_every": 2, "eval_sentences": 2, "keep_last": 5, "progress": False,
                "samples": 0, **SHALLOW, **settings}
    return train(recipes.run_from_flat(**settings), out)


def _lines(run_dir: Path) -> list[dict]:
    """The training's own lines (what each process compiled and how long it took vary)."""
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return [line for line in lines if line["kind"] not in ("compile", "summary")]


def _saved_bookkeeping(run_dir: Path, step: int) -> dict:
    """The trainer's bookkeeping in checkpoint `step` (the JSON item "data")."""
    return json.loads((run_dir / checkpoint.CHECKPOINTS_DIR / str(step) / "data" / "metadata")
                      .read_text())


def _exported(run_dir: Path) -> dict:
    return json.loads((run_dir / model_dir.MODEL_DIR / model_dir.CONFIG_FILE).read_text())


# ----------------------------------------------------------------------------- checkpoints


def test_final_save_keeps_the_closing_log_line_and_validation(corpus, bleus, tmp_path,
                                                               caplog):
    """Step 5 is saved in the loop; the closing log line and validation then change the
    bookkeeping, which must be saved again, or a resumed run repeats them."""
    out = tmp_path / "run"
    bleus += [1.0, 3.0, 2.0]  # steps 2, 4 and the closing validation at 5 (not the best)
    with caplog.at_level(logging.INFO, logger="nmt.training.trainer"):
        _run(corpus, out, max_steps=5, save_every=5, bleu_tokenize="intl")
    assert bleus.settings == [{"target_language": "de", "bleu_tokenize": "intl"}] * 3
    said = [r.getMessage() for r in caplog.records if "BLEU" in r.getMessage()]
    assert said == ["validation scores BLEU with sacreBLEU's intl tokenizer (--bleu-tokenize)"]
    assert describe_bleu("13a", False).endswith("(the target language's; --bleu-tokenize "
                                                 "picks another)")
    book = _saved_bookkeeping(out, 5)
    # Off the --eval-every grid, the closing validation is the last but counts no patience.
    assert book["last_eval"]["step"] == 5 and book["bad_evals"] == 0
    assert (book["best_metric"], book["best_score"], book["best_step"]) == ("bleu", 3.0, 4)
    assert book["window"] == []  # logged at step 5
    lines = _lines(out)

    bleus += [0.5]  # must stay unused
    summary = _run(corpus, out, max_steps=5, save_every=5, bleu_tokenize="intl")
    assert _lines(out) == lines  # no second "train" or "eval" line at step 5
    assert bleus == [0.5]
    assert (summary["steps"], summary["best_step"], summary["best_score"]) == (5, 4, 3.0)


def test_best_step_has_a_checkpoint_and_is_the_one_exported(corpus, bleus, tmp_path, caplog,
                                                            monkeypatch):
    out = tmp_path / "run"
    bleus += [1.0, 2.0, 3.0]  # steps 2, 4, 6: each the best so far
    with monkeypatch.context() as patched:
        poison_parameters_before(patched, step=7)
        with pytest.raises(TrainingError, match="newest checkpoint is step 6"):
            _run(corpus, out, max_steps=8, save_every=4)
    # The error left no thread reading batches ahead.
    assert not [t for t in threading.enumerate() if t.name == loader.THREAD_NAME]
    # A new best BLEU writes the checkpoint of its step too, whatever --save-every says: the
    # diverged run resumes from step 6, whose bookkeeping records best/6. Off the schedule,
    # step 2 went once a later step was saved: --keep-last counts only steps 4, 8, ...
    assert checkpoint.complete_steps(out / checkpoint.CHECKPOINTS_DIR) == [4, 6]
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [6]
    assert _saved_bookkeeping(out, 6)["best_step"] == 6

    # Had the run died after writing best/6 but before checkpoints/6, the resumed run (from
    # step 4, whose best step 4 best/6 replaced) deletes best/6 and writes best/4 again from
    # checkpoints/4: the best stays step 4's, above the later steps' scores.
    shutil.rmtree(out / checkpoint.CHECKPOINTS_DIR / "6")
    bleus += [0.4, 0.5]  # steps 6 and 8
    with caplog.at_level(logging.WARNING, logger="trainer"):
        summary = _run(corpus, out, max_steps=8, save_every=4)
    assert "saved after step 4, where this run starts" in caplog.text
    assert f"{out / checkpoint.CHECKPOINTS_DIR / '4'}, which holds the same" in caplog.text
    assert (summary["best_step"], summary["best_score"]) == (4, 2.0)
    exported = _exported(out)
    assert (exported["step"], exported["bleu"]) == (4, 2.0)
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [4]


def test_a_closing_validation_off_the_grid_counts_for_model_only_not_for_a_resumed_run(
        corpus, bleus, tmp_path):
    """A run stopped off the --eval-every grid (by --max-minutes; here --max-steps 5) validates
    at its stop: its model/ takes that step when it scores best, but best/, the patience and
    the checkpoints kept do not count it, so the resumed run stops early, keeps and exports
    what an uninterrupted run would."""
    out, settings = tmp_path / "run", {"early_stop_patience": 2, "save_every": 2}
    bleus += [2.0, 1.0, 3.0]  # steps 2, 4, and the closing validation at 5: the best
    summary = _run(corpus, out, max_steps=5, **settings)
    assert (summary["best_step"], summary["best_score"]) == (5, 3.0)
    assert (_exported(out)["step"], _exported(out)["bleu"]) == (5, 3.0)
    book = _saved_bookkeeping(out, 5)
    assert (book["best_step"], book["bad_evals"], book["last_eval"]["step"]) == (2, 1, 5)
    evals = [line for line in _lines(out) if line["kind"] == "eval"]
    assert [line.get("closing") for line in evals] == [None, None, True]
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [2]
    assert (out / checkpoint.CHECKPOINTS_DIR / "5" / checkpoint.INTERIM_FILE).exists()

    bleus += [1.5, 9.0]  # step 6, the second without a better one; step 8 must not come
    summary = _run(corpus, out, max_steps=8, **settings)
    assert (summary["stopped"], summary["steps"], summary["best_step"]) == ("early_stop", 6, 2)
    assert _exported(out)["step"] == 2
    assert checkpoint.complete_steps(out / checkpoint.CHECKPOINTS_DIR) == [2, 4, 6]


def test_a_resumed_run_stops_at_the_loss_spike_an_uninterrupted_one_stops_at(
        corpus, bleus, tmp_path, monkeypatch):
    """--loss-spike compares a loss with the median of the last steps: the checkpoint keeps
    them, so a run resumed just before a spike stops there too (with only the unwritten log
    window's losses it had no history, and trained on into the spike)."""
    settings = {"eval_every": 100, "save_every": 12, "log_every": 5, "loss_spike": 10.0}
    bleus += [1.0, 1.0]  # the validations at stop (the second: had the spike gone unseen)
    _run(corpus, tmp_path / "run", max_steps=12, **settings)
    assert len(_saved_bookkeeping(tmp_path / "run", 12)["recent_losses"]) == 12
    poison_parameters_before(monkeypatch, step=14, factor=60.0)
    with pytest.raises(TrainingError, match="times the median loss of the previous 13 steps"):
        _run(corpus, tmp_path / "run", max_steps=16, **settings)


@pytest.mark.parametrize("metric, best_step", [("chrf", 4), ("ppl", 5)])
def test_best_metric_picks_the_checkpoint(corpus, cache, monkeypatch, tmp_path, metric,
                                          best_step):
    # The same scores at steps 2, 4 and 5 (the closing validation): chrF is best at its
    # highest, perplexity at its lowest. BLEU, best at step 2, must not decide. model/ takes
    # the closing validation's step 5, best/ (what a resumed run continues from) step 2.
    scores, bleu = {2: 2.0, 4: 3.0, 5: 1.0}, {2: 9.0, 4: 1.0, 5: 1.0}
    results = [{"loss": 1.0, "nll": 1.0, "accuracy": 0.5, "ppl": scores[step],
                "chrf": scores[step], "bleu": bleu[step]} for step in (2, 4, 5)]
    monkeypatch.setenv("FLAX_NMT_CACHE", str(cache))
    monkeypatch.setattr(Validator, "scores",
                        lambda self, graphdef, params, not_finite, deadline=None: results.pop(0))
    out = tmp_path / "run"
    summary = _run(corpus, out, max_steps=5, best_metric=metric)
    assert (summary["best_metric"], summary["best_step"]) == (metric, best_step)
    assert summary["best_score"] == scores[best_step]
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [{4: 4, 5: 2}[best_step]]
    exported = _exported(out)
    assert (exported["step"], exported[metric]) == (best_step, scores[best_step])
    assert exported["chosen"] == {"chrf": "best validation chrF",
                                  "ppl": "best validation perplexity"}[metric]


def test_resume_keeps_or_restarts_the_best_by_metric_and_bleu_tokenizer(corpus, bleus, tmp_path,
                                                                         caplog):
    out = tmp_path / "run"
    bleus += [1.0, 2.0]  # steps 2 and 4
    _run(corpus, out, max_steps=4)
    bleus += [1.5]  # step 6: worse than step 4's 2.0, which stays the best
    summary = _run(corpus, out, max_steps=6)
    assert (summary["best_metric"], summary["best_score"], summary["best_step"]) == ("bleu", 2.0,
                                                                                     4)

    # BLEU tokenized another way: step 6's 13a score does not count; no validation follows.
    with caplog.at_level(logging.WARNING, logger="trainer"):
        summary = _run(corpus, out, max_steps=6, bleu_tokenize="char")
    assert ("chosen by BLEU tokenized with 13a; from now on BLEU tokenized with char chooses "
            "best/ and model/, starting at the next validation") in caplog.text
    assert (summary["best_step"], _exported(out)["chosen"]) == (None, "last step")
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == []

    # Another metric: the validation of step 6, the step resumed from, holds perplexity.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        summary = _run(corpus, out, max_steps=6, best_metric="ppl")
    assert ("from now on perplexity chooses best/ and model/, starting from the validation of "
            "step 6") in caplog.text
    assert "saved after step" not in caplog.text  # not a step of a run being redone
    assert (summary["best_metric"], summary["best_step"]) == ("ppl", 6)
    assert summary["best_score"] == summary["last_eval"]["ppl"]
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [6]
    assert _exported(out)["chosen"] == "best validation perplexity"

    # Resumed without --best-metric (as the interruption hint says), the run keeps perplexity.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        summary = _run(corpus, out, max_steps=6)
    assert "from now on" not in caplog.text
    assert (summary["best_metric"], summary["best_step"]) == ("ppl", 6)
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [6]


def test_resumed_with_eval_sentences_0_a_bleu_best_is_dropped_and_model_is_the_last_step(
        corpus, bleus, tmp_path, caplog):
    """No later step can be scored by BLEU: the carried-over best would be model/ for ever."""
    out = tmp_path / "run"
    bleus += [1.0, 2.0]  # steps 2 and 4
    _run(corpus, out, max_steps=4)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        summary = _run(corpus, out, max_steps=6, eval_sentences=0)
    assert ("--eval-sentences 0 scores no BLEU: the best step so far (4) no longer counts, "
            "and model/ is the last step") in caplog.text
    assert summary["best_step"] is None
    assert (_exported(out)["step"], _exported(out)["chosen"]) == (6, "last step")
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == []


def test_resume_after_early_stop_stops_at_once(corpus, bleus, tmp_path, capsys):
    out = tmp_path / "run"
    bleus += [2.0, 1.0]
    summary = _run(corpus, out, max_steps=20, early_stop_patience=1)
    assert (summary["stopped"], summary["steps"]) == ("early_stop", 4)
    lines = _lines(out)
    bleus += [3.0]  # must stay unused
    summary = _run(corpus, out, max_steps=20, early_stop_patience=1)
    assert (summary["stopped"], summary["steps"]) == ("early_stop", 4)
    assert bleus == [3.0] and _lines(out) == lines
    assert "raise it to train on" in capsys.readouterr().out


def test_throughput_leaves_out_validation_and_saving(corpus, bleus, tmp_path, monkeypatch):
    # Validation at steps 2, 4 and 6, the first slow (slow_s on the run's clock); a save at
    # step 4, slow too, outside validation (which improves only at step 2, where its own
    # save is part of it). Counted, either would make a window of two steps last slow_s or
    # more; the steps themselves take milliseconds (seconds on a busy machine).
    slow_s = 60.0
    clock = ShiftedClock()
    monkeypatch.setattr(stopping, "time", clock)
    save = checkpoint.Checkpointer.save

    def slow_save(self, step, *args, **kwargs):
        if step == 4:
            clock.wait(slow_s)
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", slow_save)
    bleus += [1.0, 0.5, 0.5]
    bleus.translate_s += [slow_s]
    bleus.wait = clock.wait
    out = tmp_path / "run"
    _run(corpus, out, max_steps=6, log_every=2, eval_every=2, save_every=4)
    assert clock.shift == 2 * slow_s  # the slow validation and the slow save both ran
    lines = {x["step"]: x for x in _lines(out) if x["kind"] == "train"}
    for step in (4, 6):  # the windows after the slow validation and after the slow save
        assert lines[step]["tokens"] / lines[step]["tokens_per_s"] < slow_s / 2


def test_max_epochs_stops_at_the_epoch_boundary_and_resumes_to_the_next(corpus, bleus,
                                                                         tmp_path):
    out = tmp_path / "run"
    bleus += [1.0, 2.0]  # the closing validation of each run
    settings = {"batch_tokens": 1024, "eval_every": 1000, "save_every": 1000}
    first = _run(corpus, out, max_epochs=1, **settings)
    per_epoch = first["steps"]
    assert first["stopped"] == "max_epochs" and per_epoch > 1
    assert _saved_bookkeeping(out, per_epoch)["iterator"] == {"epoch": 0, "position": per_epoch}
    second = _run(corpus, out, max_epochs=2, **settings)
    assert (second["stopped"], second["steps"]) == ("max_epochs", 2 * per_epoch)
    assert _saved_bookkeeping(out, 2 * per_epoch)["iterator"] == {"epoch": 1,
                                                                  "position": per_epoch}


def test_a_resumed_run_with_sampled_segmentations_logs_what_an_uninterrupted_one_logs(
        corpus, bleus, tmp_path, monkeypatch):
    """Each epoch's segmentations are a function of the seed and the epoch: a run cut in its
    first epoch and resumed trains on the batches an uninterrupted run trains on, into the
    second epoch, and logs the same losses."""
    # Words of random syllables: several segmentations each in a 320-piece vocabulary.
    syllables = syllable_sentences(150, 3)
    (tmp_path / "train.en").write_text("\n".join(syllables) + "\n")
    (tmp_path / "train.de").write_text("\n".join(s[::-1] for s in syllables) + "\n")
    corpus = {**corpus, "train": str(tmp_path / "train")}
    settings = {"subword_alpha": 0.5, "eval_every": 1000, "save_every": 1000, "log_every": 1,
                "max_tokens_per_sentence": 48, "buckets": (48,), "batch_tokens": 384}
    bleus += [1.0, 1.0, 1.0]
    closed = []
    monkeypatch.setattr(SampledEpochs, "close",
                        lambda self, close=SampledEpochs.close: closed.append(close(self)))
    straight = tmp_path / "straight"
    _run(corpus, straight, max_steps=24, **settings)
    assert len(closed) == 1     # the sampler stopped when training did, not left to the exit
    book = _saved_bookkeeping(straight, 24)
    assert book["iterator"]["epoch"] >= 1
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copyfile(straight / model_dir.TOKENIZER_FILE, cut / model_dir.TOKENIZER_FILE)
    _run(corpus, cut, max_steps=5, **settings)
    _run(corpus, cut, max_steps=24, **settings)
    expected = [line for line in _lines(straight) if line["kind"] == "train"]
    got = [line for line in _lines(cut) if line["kind"] == "train"]
    assert [line["step"] for line in got] == [line["step"] for line in expected]
    for a, b in zip(got, expected):
        assert (a["loss"], a["tokens"]) == (b["loss"], b["tokens"]), a["step"]
    # The segmentations were sampled: the tokens the steps saw are not the fixed ones'.
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    shutil.copyfile(straight / model_dir.TOKENIZER_FILE, fixed / model_dir.TOKENIZER_FILE)
    bleus += [1.0]
    _run(corpus, fixed, max_steps=3, **{**settings, "subword_alpha": None})
    plain = [line["tokens"] for line in _lines(fixed) if line["kind"] == "train"]
    assert plain != [line["tokens"] for line in expected[:3]]


def test_resume_with_another_batch_plan_or_seed(corpus, bleus, tmp_path, caplog):
    """A saved position indexes the epoch's batch plan; with another --batch-tokens the plan
    differs, so the resumed run starts the next epoch instead of going on mid-epoch. Another
    --seed is refused."""
    out = tmp_path / "run"
    bleus += [1.0, 2.0]
    _run(corpus, out, max_steps=2)
    assert _saved_bookkeeping(out, 2)["iterator"] == {"epoch": 0, "position": 2}
    with caplog.at_level(logging.WARNING, logger="trainer"):
        _run(corpus, out, max_steps=3, batch_tokens=512)
    assert "the rest of epoch 0 is skipped" in caplog.text
    assert _saved_bookkeeping(out, 3)["iterator"] == {"epoch": 1, "position": 1}
    caplog.clear()
    bleus += [3.0]
    with caplog.at_level(logging.WARNING, logger="trainer"):
        _run(corpus, out, max_steps=4, batch_tokens=512)  # the same plan: no skip
    assert "skipped" not in caplog.text
    assert _saved_bookkeeping(out, 4)["iterator"] == {"epoch": 1, "position": 2}
    # The seed orders each epoch and picks held-out validation pairs: another seed would
    # repeat some training pairs, skip others and could train on validation.
    with pytest.raises(TrainingError, match="trained with --seed 0.*pass --seed 0 to resume"):
        _run(corpus, out, max_steps=5, batch_tokens=512, seed=1)


# ----------------------------------------------------------------------------- settings


def test_run_config_checks_limits_and_early_stopping():
    with pytest.raises(SettingsError, match="--max-steps must be >= 0, got -1"):
        TrainerConfig(max_steps=-1)
    TrainerConfig(max_steps=0)
    with pytest.raises(SettingsError, match="--max-epochs must be >= 1"):
        TrainerConfig(max_epochs=0)
    assert TrainerConfig(max_epochs=3).limits() == (None, None)  # no default time limit
    with pytest.raises(SettingsError, match="--early-stop-patience 2 .* --eval-sentences 0"):
        TrainerConfig(early_stop_patience=2, eval_sentences=0)
    with pytest.raises(SettingsError,
                       match="--best-metric must be one of bleu, chrf, ppl, got 'loss'"):
        TrainerConfig(best_metric="loss")
    for metric, label in (("chrf", "chrF"), ("bleu", "BLEU")):
        with pytest.raises(SettingsError, match=rf"--best-metric {metric} needs --eval-sentences "
                                                rf">= 1 \(0 computes no {label}\)"):
            TrainerConfig(best_metric=metric, eval_sentences=0)
    TrainerConfig(eval_sentences=0)  # the default metric, BLEU, unset: model/ is the last step
    TrainerConfig(best_metric="ppl", eval_sentences=0, early_stop_patience=2)  # no translating


def _earlier_run(tmp_path: Path, **settings) -> Path:
    """A run directory as an earlier run left it: spm.model, config.yaml with its settings
    and a checkpoint trained with them (its files only: the checks come before reading it)."""
    out = tmp_path / "run"
    (out / "checkpoints" / "100" / "params").mkdir(parents=True)
    (out / "checkpoints" / "100" / "params" / "leaf").write_bytes(b"parameters")
    (out / "checkpoints" / "100" / "_CHECKPOINT_METADATA").write_text('{"item_handlers": {}}')
    (out / model_dir.TOKENIZER_FILE).write_bytes(b"an earlier run's SentencePiece model")
    (out / "config.yaml").write_text(recipes.dump(recipes.run_from_flat(preset="tiny",
                                                                      **settings)))
    return out


def test_a_start_that_took_no_step_leaves_no_tokenizer_to_be_refused(corpus, bleus, tmp_path):
    """A first start that failed (a budget too short) leaves spm.model and config.yaml but no
    checkpoint: a start with another --vocab-size trains its own tokenizer, not an error."""
    out = _earlier_run(tmp_path, vocab_size=400)
    shutil.rmtree(out / "checkpoints")
    bleus += [1.0]
    _run(corpus, out, max_steps=1, eval_every=1)  # --vocab-size 320
    assert load_tokenizer(out).vocab_size == 320
    assert recipes.load_saved(out / "config.yaml").tokenizer.vocab_size == 320


def test_a_tokenizer_that_no_config_recorded_is_not_reused_by_a_first_step(corpus, bleus,
                                                                           tmp_path):
    """A start that failed before writing config.yaml (every pair filtered out, say) leaves
    only spm.model: its settings are unknown, so the run trains its own rather than taking
    one of 300 pieces for --vocab-size 320 and recording 320."""
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from translate_model import sentences

    out = tmp_path / "run"
    train_tokenizer(sentences(300, seed=3), TokenizerConfig(vocab_size=300)).save(out)
    assert load_tokenizer(out).vocab_size == 300
    bleus += [1.0]
    _run(corpus, out, max_steps=1, eval_every=1)  # --vocab-size 320
    assert load_tokenizer(out).vocab_size == 320


def test_resume_with_another_tokenizer_type_is_an_error(tmp_path):
    out = _earlier_run(tmp_path, tokenizer_type="unigram", vocab_size=320)
    with pytest.raises(TrainingError, match=r"spm.model was trained with --tokenizer-type "
                                            r"unigram .* asks for --tokenizer-type bpe"):
        train(recipes.run_from_flat(preset="tiny", vocab_size=320, tokenizer_type="bpe"), out)


def test_resume_with_another_vocabulary_size_is_an_error(tmp_path):
    out = _earlier_run(tmp_path, vocab_size=320)
    with pytest.raises(TrainingError, match=r"spm.model was trained with --vocab-size 320 .* "
                                            r"asks for --vocab-size 400: pass --vocab-size 320"):
        train(recipes.run_from_flat(preset="tiny", vocab_size=400), out)


def test_resume_of_a_run_with_spm_model_needs_the_flag_again(tmp_path):
    out = _earlier_run(tmp_path, spm_model="shared/spm.model", vocab_size=4000)
    with pytest.raises(TrainingError, match=r"uses the SentencePiece model of --spm-model "
                                            r"shared/spm.model .* pass that flag again"):
        train(recipes.run_from_flat(preset="tiny"), out)


def test_a_window_where_r_drop_was_turned_on_or_off_logs_its_kl_over_the_steps_that_had_it():
    """A resumed run may change --rdrop within the log window the stopped run began."""
    def step(tokens, kl=None):
        metrics = {"loss": 2.0, "nll": 1.5, "accuracy": 0.5, "learning_rate": 1e-3,
                   "grad_norm": 1.0, "tokens": tokens}
        return metrics if kl is None else {**metrics, "kl": kl}

    turned_off = summarize_window([step(100, kl=0.3), step(300, kl=0.1), step(200)])
    assert turned_off["kl"] == pytest.approx((100 * 0.3 + 300 * 0.1) / 400)
    assert turned_off["tokens"] == 600
    turned_on = summarize_window([step(200), step(100, kl=0.3)])
    assert turned_on["kl"] == pytest.approx(0.3)
    assert "kl" not in summarize_window([step(200), step(100)])


def test_metrics_file_with_a_line_cut_short(tmp_path, caplog):
    lines = [{"kind": "train", "step": 3}, {"kind": "train", "step": 6}]
    path = tmp_path / METRICS_FILE
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "tra')
    with caplog.at_level(logging.WARNING, logger="trainer"):
        MetricsWriter(tmp_path, resume_step=3, enabled=True).close()
    assert f"{path} line 3" in caplog.text
    assert _lines(tmp_path) == lines[:1]


def _tensorboard_scalars(run_dir: Path) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of the event files under run_dir/tb, read record by record."""
    from tensorboardX.proto import event_pb2  # imported by MetricsWriter (without torch)

    scalars = {}
    for path in sorted((run_dir / TB_DIR).glob("events.*")):
        data = path.read_bytes()
        while data:
            size = struct.unpack("<Q", data[:8])[0]
            event = event_pb2.Event.FromString(data[12:12 + size])
            data = data[12 + size + 4:]
            for value in event.summary.value:
                assert (value.tag, event.step) not in scalars, "a row written twice"
                scalars[value.tag, event.step] = round(value.simple_value, 4)
    return scalars


def test_a_resume_writes_tensorboard_anew_from_metrics_jsonl(tmp_path):
    """A kill can lose the rows TensorBoard still buffered: metrics.jsonl holds them, and a
    resume writes them back, up to the step it resumes from and nothing after it."""
    rows = [("train", 10, {"loss": 5.5, "lr": 0.25}), ("eval", 20, {"loss": 4.25}),
            ("train", 20, {"loss": 4.5, "closing": True}), ("train", 30, {"loss": 3.5})]
    writer = MetricsWriter(tmp_path, resume_step=0, enabled=True)
    for kind, step, values in rows:
        writer.write(kind, step, values)
    writer.close()
    for path in (tmp_path / TB_DIR).glob("events.*"):  # as if killed before TensorBoard wrote
        path.write_bytes(b"")
    (tmp_path / TB_DIR / "mine").mkdir()  # a user's own files there stay
    (tmp_path / TB_DIR / "mine" / "notes.txt").write_text("kept")
    MetricsWriter(tmp_path, resume_step=20, enabled=True).close()
    assert (tmp_path / TB_DIR / "mine" / "notes.txt").read_text() == "kept"
    assert _tensorboard_scalars(tmp_path) == {("train/loss", 10): 5.5, ("train/lr", 10): 0.25,
                                              ("eval/loss", 20): 4.25, ("train/loss", 20): 4.5}
    assert [line["step"] for line in _lines(tmp_path)] == [10, 20, 20]


def test_a_resume_writes_tensorboard_through_a_linked_tb_folder(tmp_path):
    """tb/ linked to a shared TensorBoard folder stays a link: the resumed run's rows go there."""
    shared, run = tmp_path / "shared", tmp_path / "run"
    shared.mkdir()
    run.mkdir()
    (run / TB_DIR).symlink_to(shared)
    writer = MetricsWriter(run, resume_step=0, enabled=True)
    writer.write("train", 10, {"loss": 5.5})
    writer.close()
    MetricsWriter(run, resume_step=10, enabled=True).close()
    assert (run / TB_DIR).is_symlink()
    assert _tensorboard_scalars(run) == {("train/loss", 10): 5.5}


# ----------------------------------------------------------------------------- data


def test_validation_keeps_pairs_longer_than_the_training_limit(corpus, cache, monkeypatch,
                                                               tmp_path):
    """--max-tokens-per-sentence filters training pairs only; validation keeps every pair that
    fits the model (these validation sentences have 6-12 words, longer than 8 tokens)."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(cache))
    run = recipes.run_from_flat(preset="tiny", train_prefix=corpus["train"],
                              valid_prefix=corpus["valid_long"], vocab_size=320,
                              max_tokens_per_sentence=8, buckets=(8,))
    data = prepare_data(run, tmp_path, model_max_len=64)
    assert len(data.valid_examples) == 12
    assert 0 < len(data.train_examples) < 400
    assert data.eval_batch_config.max_len == 64


def test_test_split_is_not_encoded_but_scored_in_the_summary(corpus, cache, monkeypatch,
                                                             tmp_path, capsys):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(cache))
    encoded = []
    encode_shared = nmt.training.run_data.encode_shared

    def recording(split, *args, **kwargs):
        encoded.append(len(split))
        return encode_shared(split, *args, **kwargs)

    monkeypatch.setattr(nmt.training.run_data, "encode_shared", recording)
    run = recipes.run_from_flat(preset="tiny", train_prefix=corpus["train"],
                              valid_prefix=corpus["valid"], test_prefix=corpus["test"],
                              vocab_size=320, buckets=(16,), max_tokens_per_sentence=16)
    prepared = prepare_data(run, tmp_path, model_max_len=64)
    assert prepared.counts["test"] == 7 and sorted(encoded) == [12, 400]

    command = scoring_command(tmp_path / "model", run)
    assert command == (f"python translate.py --model {tmp_path / 'model'} --evaluate "
                       f"--test-prefix {corpus['test']} --src en --tgt de")
    print_summary({"steps": 1, "stopped": "max_steps", "minutes": 0.1, "best_score": None,
                   "model_dir": "m", "translate_command": "t", "test_command": command},
                  tmp_path)
    assert f"Score the test set: {command}" in capsys.readouterr().out
    as_file = run.replace(data={"test_prefix": None, "test_file": "my test.tsv"})
    assert scoring_command(Path("m"), as_file) == ("python translate.py --model m --evaluate "
                                                   "--test-file 'my test.tsv' --src en --tgt de")
    as_char = run.replace(data={"tgt": "ja"}, trainer={"bleu_tokenize": "char"})
    assert scoring_command(Path("m"), as_char).endswith("--tgt ja --bleu-tokenize char")


def test_spm_model_is_the_tokenizer_and_must_stay_it_on_resume(corpus, cache, monkeypatch,
                                                               tmp_path):
    import sentencepiece

    from data.corpus import DataError
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from translate_model import sentences

    monkeypatch.setenv("FLAX_NMT_CACHE", str(cache))
    given = train_tokenizer(sentences(300, seed=3), TokenizerConfig(vocab_size=300)).save(
        tmp_path / "given")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # vocab_size 4000 (the default) does not apply: the given model has 300 pieces.
    run = recipes.run_from_flat(preset="tiny", train_prefix=corpus["train"],
                              valid_prefix=corpus["valid"], spm_model=str(given), buckets=(16,),
                              max_tokens_per_sentence=16)
    data = prepare_data(run, run_dir, model_max_len=64)
    assert data.tokenizer.vocab_size == 300
    assert (run_dir / model_dir.TOKENIZER_FILE).read_bytes() == given.read_bytes()
    assert prepare_data(run, run_dir, model_max_len=64).tokenizer.vocab_size == 300  # resume

    other = train_tokenizer(sentences(300, seed=4), TokenizerConfig(vocab_size=300)).save(
        tmp_path / "other")
    with pytest.raises(DataError, match=rf"{run_dir / 'spm.model'} is not the tokenizer of "
                                        rf"--spm-model {other}"):
        prepare_data(run.replace(tokenizer={"spm_model": str(other)}), run_dir, 64)

    # SentencePiece's own defaults (unk 0, bos 1, eos 2, no pad) cannot serve this model.
    defaults = tmp_path / "defaults"
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences(300, seed=5)),
                                             model_prefix=str(defaults), vocab_size=60)
    with pytest.raises(DataError, match=r"defaults.model: SentencePiece model has pad/unk/bos/"
                                        r"eos ids \(-1, 0, 1, 2\).* spm_train --pad_id=0"):
        prepare_data(run.replace(tokenizer={"spm_model": f"{defaults}.model"}),
                     tmp_path / "fresh", 64)


def _poison_parameters_after(monkeypatch, step: int) -> None:
    """NaN parameters after update `step`, whose own loss (computed before it) stays finite:
    what an update too large does."""
    train_one_step = nmt.training.trainer.Trainer._train_one_step

    def poisoned(self):
        metrics = train_one_step(self)
        if self.step == step:
            self.state = self.state.replace(
                params=jax.tree.map(lambda x: x * jnp.nan, self.state.params))
        return metrics

    monkeypatch.setattr(nmt.training.trainer.Trainer, "_train_one_step", poisoned)


def test_a_validation_of_parameters_an_update_broke_stops_as_diverged(corpus, bleus,
                                                                       tmp_path, monkeypatch):
    """Step 4's loss is finite, its update leaves NaN: its validation says the run diverged
    at step 4 before anything records a NaN perplexity as the best (NaN < x is always False,
    so nothing would beat it) or writes a bare NaN into metrics.jsonl."""
    out = tmp_path / "run"
    _poison_parameters_after(monkeypatch, step=4)
    with pytest.raises(TrainingError, match=r"became nan/[0-9.e+-]+ at step 4 \(learning rate "
                                            r"[0-9.e+-]+\); the newest checkpoint is step 2.*"
                                            r"Lower --lr-scale/--peak-lr"):
        _run(corpus, out, max_steps=8, best_metric="ppl", save_every=2, eval_sentences=0)
    assert checkpoint.complete_steps(out / checkpoint.BEST_DIR) == [2]

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    lines = [json.loads(line, parse_constant=strict)
             for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [line["step"] for line in lines if line["kind"] == "eval"] == [2]


def test_nan_never_improves_and_a_recorded_nan_is_beaten():
    book = Bookkeeping(best_metric="ppl")
    assert not book.improves(math.nan) and book.improves(5.0)
    book.best_score, book.best_step = math.nan, 3  # recorded by an older version
    assert book.improves(5.0)
    assert not Bookkeeping(best_metric="bleu", best_score=1.0).improves(math.nan)
