"""CTranslate2 as an engine (nmt.engines): the same settings give the JAX engine's output, what
it cannot express is refused in one line, its conversions are cached whole and rebuilt when
stale or damaged, and translating with it never imports JAX.

The model is the tiny one of tests/translate_model.py, whose next-token distributions are
peaked, so float32 searches of the two engines pick the same tokens.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from translate_model import search_config, sentences

pytest.importorskip("ctranslate2")

from nmt.engines import conversions  # noqa: E402
from nmt.engines.ctranslate2 import (  # noqa: E402
    EngineError,
    engine_search,
    open_translator,
    search_options,
)

REPO = Path(__file__).resolve().parents[1]
LINES = sentences(30, seed=3)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A conversion cache of this module's own (FLAX_NMT_CACHE)."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLAX_NMT_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def ending_dir(run_dir, tmp_path_factory) -> Path:
    """The tiny model with an output bias: PAD and BOS never likely, and EOS likely enough
    that about half the translations end before their limit, at lengths from 1 to 30 tokens."""
    return ending_model(run_dir, tmp_path_factory.mktemp("ending") / "model")


def ending_model(run_dir: Path, out: Path, pad_logit: float | None = None, **overrides) -> Path:
    """`ending_dir`'s model, with `overrides` of its ModelConfig, written to `out`; with
    `pad_logit`, PAD's output row is zero and its bias `pad_logit`, so that PAD has that logit
    at every step (a probability from about e-20 to e-5 at 10)."""
    import numpy as np
    from flax import nnx

    from data.tokenizer import load_tokenizer
    from nmt.models.model_dir import export_model
    from transformer.config import get_preset
    from transformer.model import Transformer

    tokenizer = load_tokenizer(run_dir / "model")
    config = get_preset("tiny", vocab_size=tokenizer.vocab_size, output_bias=True, **overrides)
    params = nnx.state(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)
    table = params["src_embedding"]["table"]["embedding"]
    byte_rows = [i for i in range(tokenizer.vocab_size) if tokenizer.processor.is_byte(i)]
    table[...] = (table[...] * 8.0).at[np.array(byte_rows)].set(0.0)  # as translate_model's
    bias = params["output_bias"]
    bias[...] = (bias[...].at[config.pad_id].set(-1e4).at[config.bos_id].set(-1e4)
                 .at[config.eos_id].set(18.0))
    if pad_logit is not None:
        table[...] = table[...].at[config.pad_id].set(0.0)  # PAD is never an input
        bias[...] = bias[...].at[config.pad_id].set(pad_logit)
    export_model(out, params, config, tokenizer, search_config())
    return out


def both(directory: Path, search, **settings):
    """(JAX's Translations, CTranslate2's Translations) of LINES with `search`; CTranslate2
    translates two batches at once (its default on two cores or more) unless `settings` say
    otherwise. The commands of the tests below run with the default of their process's
    cores: one in the suite's workers (conftest.py)."""
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    model, tokenizer, _ = load_models([directory])
    ours = Translator(model, tokenizer, search).translate_all(LINES)
    ct2, _ = open_translator(directory, lambda stored: search, compute_type="float32",
                             **{"searches": 2, **settings})
    return ours, ct2.translate_all(LINES)


def tokens(translations, lines=None):
    return [[h.tokens for h in nbest] for i, nbest in enumerate(translations.nbest, 1)
            if lines is None or i in lines]


def scores(translations, lines=None):
    return [h.score for i, nbest in enumerate(translations.nbest, 1) for h in nbest
            if lines is None or i in lines]


# ----------------------------------------------------------------------------- same meaning


@pytest.mark.parametrize("overrides", [{"positional": "learned"},
                                       {"positional": "learned", "norm": "pre"}],
                         ids=["learned", "learned-pre-norm"])
def test_a_learned_position_table_converts_exactly(overrides, cache, run_dir, tmp_path):
    """CTranslate2's position table is added as ours is: a learned one converts as it is
    (MarianMT's is sinusoidal: to-marian refuses it)."""
    directory = ending_model(run_dir, tmp_path / "model", **overrides)
    for changes in (dict(strategy="greedy", nbest=1),
                    dict(strategy="beam", beam_size=3, nbest=2, beam_rules="k-finished",
                         length_penalty="power")):
        ours, theirs = both(directory, search_config(**changes))
        ended = set(range(1, len(LINES) + 1)) - set(ours.reached_limit) - set(theirs.reached_limit)
        assert len(ended) >= 5
        assert tokens(theirs, ended) == tokens(ours, ended)
        best = [[ours.nbest[i - 1][0].score, theirs.nbest[i - 1][0].score] for i in ended]
        assert [t for _, t in best] == pytest.approx([o for o, _ in best], abs=1e-4)
    sinusoidal = ending_model(run_dir, tmp_path / "sinusoidal",
                              **{**overrides, "positional": "sinusoidal"})
    assert tokens(both(sinusoidal, search_config(strategy="greedy", nbest=1))[0]) \
        != tokens(ours)  # the table matters to these translations


@pytest.mark.parametrize("changes", [
    dict(strategy="greedy", nbest=1),
    dict(strategy="greedy", nbest=1, min_len=7),
    dict(strategy="greedy", nbest=1, max_len_a=0.0, max_len_b=4),  # every sentence at its limit
    dict(strategy="beam", beam_size=3, nbest=2, beam_rules="k-finished", length_penalty="power"),
    dict(strategy="beam", beam_size=4, nbest=1, beam_rules="k-finished", length_penalty="power",
         alpha=1.0, max_len_a=2.0),
    # No length penalty: CTranslate2's 0 would stop a sentence once its best beam ends.
    dict(strategy="beam", beam_size=4, nbest=1, beam_rules="k-finished", length_penalty="power",
         alpha=0.0),
    dict(strategy="beam", beam_size=1, nbest=1, beam_rules="k-finished", length_penalty="power"),
    # min_len gives way to a lower limit; a limit of one token is EOS alone.
    dict(strategy="greedy", nbest=1, min_len=10, max_len_a=0.0, max_len_b=4),
    dict(strategy="greedy", nbest=1, max_len_a=0.0, max_len_b=1),
    dict(strategy="beam", beam_size=3, nbest=2, beam_rules="k-finished", length_penalty="power",
         max_len_a=0.0, max_len_b=1),
], ids=["greedy", "min_len", "limits", "beam-nbest", "beam-alpha", "beam-alpha-0", "beam-1",
        "min_len-past-limit", "greedy-limit-1", "beam-limit-1"])
def test_settings_give_jax_output(cache, ending_dir, changes):
    """Same tokens, limits reached and scores; where a beam reaches its output limit the
    engines part (ours scores the EOS forced there, CTranslate2's stops without it), so beam
    search is compared on the lines that end before it."""
    ours, theirs = both(ending_dir, search_config(**changes))
    if changes["strategy"] == "greedy":  # a greedy output is the prefix of a longer one
        assert theirs.reached_limit == ours.reached_limit
        assert tokens(theirs) == tokens(ours)
        assert [n[0].text for n in theirs.nbest] == [n[0].text for n in ours.nbest]
    ended = set(range(1, len(LINES) + 1)) - set(ours.reached_limit) - set(theirs.reached_limit)
    assert len(ended) >= (0 if changes.get("max_len_b") in (1, 4) else 5)  # what it tests
    assert tokens(theirs, ended) == tokens(ours, ended)
    if "min_len" not in changes:  # CTranslate2 gives a banned EOS's probability to the rest
        assert scores(theirs, ended) == pytest.approx(scores(ours, ended), abs=1e-4)
    if changes.get("max_len_b") == 1:  # EOS forced at once: log p(EOS | source), alone
        assert theirs.reached_limit == ours.reached_limit == list(range(1, len(LINES) + 1))
        assert {len(nbest) for nbest in theirs.nbest + ours.nbest} == {1}
        assert tokens(theirs) == tokens(ours)
        assert scores(theirs) == pytest.approx(scores(ours), abs=1e-4)


@pytest.mark.parametrize("changes", [
    dict(strategy="greedy", nbest=1),
    dict(strategy="beam", beam_size=3, nbest=2, beam_rules="k-finished", length_penalty="power"),
    dict(strategy="beam", beam_size=4, nbest=1, beam_rules="k-finished", length_penalty="power",
         alpha=1.0, max_len_a=2.0),
], ids=["greedy", "beam-nbest", "beam-alpha"])
def test_pad_with_some_probability_scores_as_jax(cache, run_dir, tmp_path_factory, changes,
                                                 caplog):
    """PAD keeps some probability at every step, as label smoothing leaves it, without ranking
    among the beams: the scores are JAX's, which bans PAD after the softmax (banning it before,
    CTranslate2's suppress_sequences, renormalizes the other tokens: 1e-3 apart here)."""
    directory = ending_model(run_dir, tmp_path_factory.mktemp("pad") / "model", pad_logit=10.0)
    ours, theirs = both(directory, search_config(**changes))
    ended = set(range(1, len(LINES) + 1)) - set(ours.reached_limit) - set(theirs.reached_limit)
    assert len(ended) >= 10
    assert tokens(theirs, ended) == tokens(ours, ended)
    assert scores(theirs, ended) == pytest.approx(scores(ours, ended), abs=1e-4)
    assert "PAD or BOS" not in caplog.text


def test_a_search_that_produces_pad_is_searched_again_without_it(cache, run_dir, tmp_path,
                                                                  caplog):
    """Where PAD is likely enough to be CTranslate2's choice, the sentence is searched again
    with PAD and BOS banned: no hypothesis holds them, greedy texts are JAX's, and one warning
    names the first line, once per translator."""
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    directory = ending_model(run_dir, tmp_path / "model", pad_logit=30.0)
    greedy = search_config(strategy="greedy", nbest=1)
    model, tokenizer, _ = load_models([directory])
    ours = Translator(model, tokenizer, greedy).translate_all(LINES)
    translator, _ = open_translator(directory, lambda stored: greedy, compute_type="float32")
    translator.warm_up()  # its "." is searched again too, but is no one's line to report
    assert "PAD or BOS" not in caplog.text
    for _ in range(2):
        theirs = translator.translate_all(LINES)
        assert tokens(theirs) == tokens(ours)
    assert not {0, 2} & {t for nbest in tokens(theirs) for h in nbest for t in h}
    warnings = [r.getMessage() for r in caplog.records if "PAD or BOS" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("input line ")
    beam = search_config(strategy="beam", beam_size=3, nbest=3, beam_rules="k-finished",
                         length_penalty="power")
    translator, _ = open_translator(directory, lambda stored: beam, compute_type="float32")
    assert not {0, 2} & {t for nbest in tokens(translator.translate_all(LINES))
                         for h in nbest for t in h}


def test_two_batches_at_once_where_there_are_two_cores(monkeypatch):
    from nmt.engines import ctranslate2 as engine

    for cores, searches in ((1, 1), (2, 2), (16, 2)):
        monkeypatch.setattr(engine, "cpu_cores", lambda cores=cores: cores)
        assert engine.default_searches() == searches


def test_the_threads_in_all_bound_the_batches_at_once(cache, run_dir, monkeypatch, caplog):
    """--threads N is every thread: the default searches fit in it, more are refused, and
    sampling (one batch at a time) says that it uses 1."""
    from nmt.engines import ctranslate2 as engine

    monkeypatch.setattr(engine, "cpu_cores", lambda: 4)
    for threads, searches, used in ((1, 0, 1), (3, 0, 2), (0, 0, 2), (4, 4, 4)):
        translator, _ = open_translator(run_dir, lambda stored: stored, compute_type="float32",
                                        threads=threads, searches=searches)
        assert (translator.searches, translator.model.num_translators) == (used, used)
    with pytest.raises(engine.EngineError, match="--searches 4 with --threads 1: "):
        open_translator(run_dir, lambda stored: stored, threads=1, searches=4)
    sample = search_config(strategy="sample", nbest=1)
    translator, _ = open_translator(run_dir, lambda stored: sample, searches=3)
    assert translator.model.num_translators == 1
    assert "--searches 3: CTranslate2 samples one batch at a time" in caplog.text


def test_an_export_computed_in_another_type_names_its_stored_weights(run_dir, tmp_path, caplog):
    import logging

    from nmt.convert.ctranslate2 import export_ctranslate2

    export = export_ctranslate2(run_dir, tmp_path / "int8", "int8")
    caplog.set_level(logging.INFO, logger="nmt.engines")
    translator, _ = open_translator(export, lambda stored: stored, compute_type="float32")
    assert translator.describe() == "ctranslate2 float32"
    assert (f"ctranslate2: {export} stores int8 weights, converted at load to compute in "
            "float32") in caplog.text
    caplog.clear()
    open_translator(export, lambda stored: stored, compute_type="int8")  # int8_float32
    assert "weights, converted at load" not in caplog.text


def test_sampling_maps_top_k_temperature_and_seed(cache, run_dir):
    greedy = both(run_dir / "model", search_config(strategy="greedy", nbest=1))[0]
    # In float32 as `greedy`: int8's rounding can turn a near tie of the tiny model the other
    # way (it did for one line once the tokenizer was trained by sentencepiece 0.2.1).
    top1, _ = open_translator(run_dir, lambda s: search_config(strategy="sample", nbest=1,
                                                               top_k=1, temperature=0.7),
                              compute_type="float32")
    assert tokens(top1.translate_all(LINES)) == tokens(greedy)  # top-k 1 is greedy
    wide = search_config(strategy="sample", nbest=1, temperature=1.5)
    draws = [open_translator(run_dir, lambda s: wide, seed=seed)[0].translate(LINES * 3)
             for seed in (5, 5, 6)]
    assert draws[0] == draws[1] != draws[2]


def test_force_decoding_scores_equal_jax(cache, run_dir):
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    model, tokenizer, _ = load_models([run_dir])
    references = sentences(30, seed=4)
    ours = Translator(model, tokenizer, search_config()).score(LINES, references)
    ct2, _ = open_translator(run_dir, lambda s: s, compute_type="float32")
    theirs = ct2.score(LINES, references)
    assert [n for _, n in theirs] == [n for _, n in ours]
    assert [s for s, _ in theirs] == pytest.approx([s for s, _ in ours], abs=1e-3)


def test_alignments_equal_jax(cache, run_dir):
    """The attention CTranslate2 returns while forced through a translation is the JAX
    engine's alignment: the last decoder layer's, averaged over its heads."""
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    model, tokenizer, _ = load_models([run_dir])
    targets = sentences(len(LINES), seed=5)
    ours = Translator(model, tokenizer, search_config()).align(LINES, targets)
    ct2, _ = open_translator(run_dir, lambda s: s, compute_type="float32")
    theirs = ct2.align(LINES, targets)
    for mine, other in zip(ours, theirs):
        assert (other.source_spans, other.target_spans) == (mine.source_spans,
                                                            mine.target_spans)
        assert other.weights == pytest.approx(mine.weights, abs=1e-4)
    assert ct2.align([], []) == []


def test_empty_and_long_sources_as_jax(cache, run_dir, caplog):
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    model, tokenizer, _ = load_models([run_dir])
    lines = ["", "  ", LINES[0], " ".join(["ein mann"] * 80)]  # the last over 64 positions
    search = search_config(strategy="greedy", nbest=1)
    with caplog.at_level(logging.WARNING):
        ours = Translator(model, tokenizer, search).translate_all(lines, first_line=7)
        ct2, _ = open_translator(run_dir, lambda s: search, compute_type="float32")
        theirs = ct2.translate_all(lines, first_line=7)
    assert tokens(theirs) == tokens(ours) and theirs.truncated == ours.truncated == [10]
    assert theirs.nbest[0][0].text == theirs.nbest[1][0].text == ""
    assert sum("line 10: a sentence of" in r.message for r in caplog.records) == 2


def test_stored_beam_rule_replaced_given_one_refused(caplog):
    stored = search_config(beam_rules="heuristic", length_penalty="gnmt")
    with caplog.at_level(logging.INFO, "nmt.engines"):
        used = engine_search(stored)
    assert (used.beam_rules, used.length_penalty) == ("k-finished", "power")
    assert sum("CTranslate2's" in r.message for r in caplog.records) == 2
    for field, value, flag in (("beam_rules", "exact", "--beam-rules exact"),
                               ("length_penalty", "gnmt", "--length-penalty gnmt")):
        with pytest.raises(EngineError, match=f"{flag}: CTranslate2's beam search has only"):
            engine_search(search_config(**{field: value}), given=frozenset({field}))
    one = engine_search(search_config(beam_size=1, nbest=1, beam_rules="heuristic",
                                      length_penalty="gnmt"))  # a beam of one is beam search
    assert (one.beam_rules, one.length_penalty, search_options(one)["beam_size"]) == (
        "k-finished", "power", 1)
    greedy = search_config(strategy="greedy", nbest=1, beam_rules="exact", min_len=3)
    assert engine_search(greedy, frozenset({"beam_rules"})) == greedy  # no beam: nothing to map
    with pytest.raises(EngineError, match="--min-len 3: CTranslate2's beam search"):
        engine_search(search_config(min_len=3), given=frozenset({"min_len"}))
    with pytest.raises(EngineError, match="the model's stored min_len 3"):
        engine_search(search_config(min_len=3))


def test_unsupported_compute_type_names_what_this_cpu_runs(cache, run_dir):
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types("cpu")
    missing = next(t for t in ("int16", "bfloat16", "float16") if t not in supported)
    with pytest.raises(EngineError, match=f"--compute-type {missing}: this CPU cannot run it "
                                          f"with CTranslate2; it runs .*int8"):
        open_translator(run_dir, lambda s: s, compute_type=missing)
    with pytest.raises(EngineError, match="--compute-type int4: not a CTranslate2 compute type"):
        open_translator(run_dir, lambda s: s, compute_type="int4")


def test_missing_ctranslate2_is_one_line_with_the_install(run_dir, monkeypatch):
    from nmt.engines.ctranslate2 import MissingEngine

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    with pytest.raises(MissingEngine, match=r"pip install -e '\.\[ct2\]'"):
        open_translator(run_dir, lambda s: s)


# ----------------------------------------------------------------------------- conversions


def model_copy(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir / "model", tmp_path / "model"))


def test_conversion_is_reused_then_rebuilt_when_the_model_changes(run_dir, tmp_path, caplog):
    model = model_copy(run_dir, tmp_path)
    files = ["spm.model"]
    with caplog.at_level(logging.INFO, "nmt.engines"):
        first = conversions.converted(model, files, "float32", tmp_path / "cache")
        again = conversions.converted(model, files, "float32", tmp_path / "cache")
        int8 = conversions.converted(model, files, "int8", tmp_path / "cache")
    assert first == again != int8
    assert sum(r.message.startswith("converting") for r in caplog.records) == 2
    config = json.loads((model / "config.json").read_text())
    config["search"]["beam_size"] = 5  # another model: its settings are part of the checksum
    (model / "config.json").write_text(json.dumps(config))
    changed = conversions.converted(model, files, "float32", tmp_path / "cache")
    assert changed != first and conversions.entry_is_whole(changed)
    assert json.loads((changed / "nmt_config.json").read_text())["search"]["beam_size"] == 5


# Checksum records of other shapes, made from the record as written.
OTHER_RECORDS = {"null": lambda kept: None, "a list": lambda kept: [],
                 "files of another shape": lambda kept: {**kept, "files": 1},
                 "no checksum": lambda kept: {"files": kept["files"]},
                 "a checksum not a string": lambda kept: {**kept, "checksum": None}}


@pytest.mark.parametrize("shape", OTHER_RECORDS)
def test_a_checksum_record_of_another_shape_is_computed_again(shape, run_dir, tmp_path):
    model, files, root = run_dir / "model", ["spm.model"], tmp_path / "cache"
    checksum = conversions.model_checksum(model, files, root)
    [record] = (root / "checksums").iterdir()
    kept = json.loads(record.read_text())
    record.write_text(json.dumps(OTHER_RECORDS[shape](kept)))
    assert conversions.model_checksum(model, files, root) == checksum
    assert json.loads(record.read_text()) == kept


def test_damaged_conversion_is_rebuilt_with_a_warning(run_dir, tmp_path, caplog):
    model = model_copy(run_dir, tmp_path)
    entry = conversions.converted(model, ["spm.model"], "float32", tmp_path / "cache")
    whole = (entry / "model.bin").read_bytes()
    (entry / "model.bin").write_bytes(whole[: len(whole) // 2])  # as a crash or a bad disk
    assert not conversions.entry_is_whole(entry)
    with caplog.at_level(logging.WARNING, "nmt.engines"):
        rebuilt = conversions.converted(model, ["spm.model"], "float32", tmp_path / "cache")
    assert rebuilt == entry and (entry / "model.bin").read_bytes() == whole
    assert [r.message for r in caplog.records if "damaged or incomplete" in r.message]
    (entry / "manifest.json").unlink()  # a conversion that died before its manifest
    assert not conversions.entry_is_whole(entry)


def test_a_stamped_entry_is_whole_without_hashing_and_hashed_once_touched(run_dir, tmp_path,
                                                                            monkeypatch):
    entry = conversions.converted(model_copy(run_dir, tmp_path), ["spm.model"], "float32",
                                  tmp_path / "cache")
    hashed = []
    sha256 = conversions._sha256
    monkeypatch.setattr(conversions, "_sha256", lambda path: hashed.append(path) or sha256(path))
    assert conversions.entry_is_whole(entry) and hashed == []

    model_bin = entry / "model.bin"
    later = model_bin.stat().st_mtime_ns + 10**9  # as a copy that kept no times
    os.utime(model_bin, ns=(later, later))
    assert conversions.entry_is_whole(entry) and hashed
    hashed.clear()  # found whole by its hashes, it is stamped anew: hashed once, not each time
    assert conversions.entry_is_whole(entry) and hashed == []
    whole = model_bin.read_bytes()
    model_bin.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))  # damaged at the same size,
    os.utime(model_bin, ns=(later, later))  # its modification time set back (`touch -r`)
    assert not conversions.entry_is_whole(entry)


@pytest.mark.parametrize("stand_in", ["a file", "a link to nowhere"])
def test_a_file_in_the_place_of_a_conversion_is_replaced(stand_in, run_dir, tmp_path, caplog):
    model, root = model_copy(run_dir, tmp_path), tmp_path / "cache"
    entry = conversions.converted(model, ["spm.model"], "float32", root)
    shutil.rmtree(entry)
    if stand_in == "a file":
        entry.write_text("not a conversion")
    else:
        entry.symlink_to(tmp_path / "nowhere")
    caplog.clear()  # what the first conversion logged, where a test before set INFO
    with caplog.at_level(logging.WARNING, "nmt.engines"):
        assert conversions.converted(model, ["spm.model"], "float32", root) == entry
    assert conversions.entry_is_whole(entry) and not entry.is_symlink()
    assert [r.message for r in caplog.records] == [
        f"the cached CTranslate2 conversion {entry} is damaged or incomplete; converting "
        f"{model} again"]


def test_cache_that_cannot_be_written_converts_into_a_temporary(run_dir, tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with caplog.at_level(logging.INFO, "nmt.engines"):
        entry = conversions.converted(run_dir / "model", ["spm.model"], "float32",
                                      blocked / "cache")
    assert conversions.entry_is_whole(entry) and blocked not in entry.parents
    assert [r.message for r in caplog.records if "cannot write the CTranslate2 cache" in
            r.message and "temporary directory" in r.message]
    # The temporary conversion goes at exit: no later run reuses it.
    converting = [r.message for r in caplog.records if r.message.startswith("converting")]
    assert len(converting) == 1 and converting[0].endswith(", for this run only"), converting


def test_a_read_only_cache_serves_the_conversion_it_holds(run_dir, tmp_path, monkeypatch,
                                                          caplog):
    model, root = model_copy(run_dir, tmp_path), tmp_path / "cache"
    entry = conversions.converted(model, ["spm.model"], "float32", root)
    opened = os.open

    def read_only(path, flags, *args):  # as on a file system mounted read-only
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return opened(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    caplog.clear()  # what the first conversion logged, where a test before set INFO
    with caplog.at_level(logging.INFO, "nmt.engines"):
        assert conversions.converted(model, ["spm.model"], "float32", root) == entry
        assert caplog.records == []
        fresh = conversions.converted(model, ["spm.model"], "int8", root)  # one it lacks
    assert conversions.entry_is_whole(fresh) and root not in fresh.parents
    assert [r.message for r in caplog.records if "cannot write the CTranslate2 cache" in
            r.message and "Read-only file system" in r.message]


def test_two_processes_converting_at_once_convert_once(run_dir, tmp_path):
    model = model_copy(run_dir, tmp_path)
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO)\n"
              "from pathlib import Path\n"
              "from nmt.engines.conversions import converted, entry_is_whole\n"
              "entry = converted(Path(sys.argv[1]), ['spm.model'], 'float32', Path(sys.argv[2]))\n"
              "assert entry_is_whole(entry)\nprint(entry)\n")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(model),
                                   str(tmp_path / "cache")], cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    assert sum(err.count("INFO:nmt.engines:converting") for _, err in outputs) == 1
    leftovers = [p.name for p in (tmp_path / "cache").iterdir()
                 if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []


def test_an_export_made_by_hand_is_used_and_one_without_settings_refused(run_dir, tmp_path):
    from nmt.convert.ctranslate2 import export_ctranslate2
    from nmt.models.model_files import ModelDirError

    export = export_ctranslate2(run_dir, tmp_path / "ct2", "int8")
    translator, values = open_translator(export, lambda s: s)
    assert values["source_lang"] == "de" and translator.translate(LINES[:2])[0]
    settings = export / "nmt_config.json"
    values = json.loads(settings.read_text())
    settings.write_text(json.dumps({**values, "search": {**values["search"], "beam_size": "4"}}))
    with pytest.raises(ModelDirError, match=r"nmt_config.json: invalid 'search' settings .*"
                       r"restore the nmt_config.json written with the model"):
        open_translator(export, lambda s: s)
    settings.write_text(json.dumps({**values, "model": {**values["model"], "d_model": "x"}}))
    with pytest.raises(ModelDirError, match=r"nmt_config.json: not a valid model configuration"
                       r".*restore the nmt_config.json written with the model"):
        open_translator(export, lambda s: s)
    settings.unlink()
    with pytest.raises(ModelDirError, match="without nmt_config.json.*to-ctranslate2"):
        open_translator(export, lambda s: s)


def test_a_model_missing_its_parameters_is_named(run_dir, tmp_path):
    from nmt.models.model_files import ModelDirError

    model = model_copy(run_dir, tmp_path)
    (model / "params.msgpack").unlink()
    with pytest.raises(ModelDirError, match="params.msgpack"):
        open_translator(model, lambda s: s)


# ----------------------------------------------------------------------------- no JAX


NO_JAX = ("import sys\n"
          "loaded = {m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'flax', 'optax'}\n"
          "assert not loaded, loaded\n")


def test_translate_py_and_the_server_start_without_jax(run_dir, tmp_path):
    env = {**os.environ, "FLAX_NMT_CACHE": str(tmp_path / "cache")}
    conversions.converted(run_dir / "model", ["spm.model"], "float32", tmp_path / "cache"
                          / "ctranslate2")  # the cached conversion: only making it needs JAX
    translate = ("from nmt.translation.command import main\n"
                 f"assert main(['--model', {str(run_dir)!r}, '--engine', 'ctranslate2', "
                 "'--compute-type', 'float32', '-q', 'Ein Hund läuft.']) == 0\n")
    serve = ("from nmt.serving.command import build_parser, load_served_models\n"
             "import nmt.serving.app\n"
             f"args = build_parser().parse_args(['--model', {str(run_dir)!r}, '--engine', "
             "'ctranslate2', '--compute-type', 'float32'])\n"
             "[model] = load_served_models(args)\n"
             "assert model.translator.translate(['Ein Hund läuft.'])[0]\n")
    for script in (translate, serve):
        result = subprocess.run([sys.executable, "-c", script + NO_JAX], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- translate.py


CT2 = ["--engine", "ctranslate2", "--compute-type", "float32"]


def translate_py(run_dir: Path, env, *flags, stdin: str | None = None
                 ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "translate.py", "--model", str(run_dir), "-q",
                           *map(str, flags)], input=stdin, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def greedy_jax(run_dir) -> list[str]:
    """JAX's greedy translation of each of LINES, in this process."""
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator

    model, tokenizer, _ = load_models([run_dir])
    return Translator(model, tokenizer, search_config(strategy="greedy", nbest=1)
                      ).translate(LINES)


def test_every_input_mode_gives_jax_greedy_translations(run_dir, env, greedy_jax, tmp_path):
    stdin = translate_py(run_dir, env, *CT2, "--greedy", stdin="".join(f"{x}\n" for x in LINES))
    assert stdin.returncode == 0, stdin.stderr
    assert stdin.stdout.split("\n")[:-1] == greedy_jax
    arguments = translate_py(run_dir, env, *CT2, "--greedy", *LINES[:3])
    assert arguments.stdout.split("\n")[:-1] == greedy_jax[:3]
    (tmp_path / "in.txt").write_text("".join(f"{x}\n" for x in LINES))
    files = translate_py(run_dir, env, *CT2, "--greedy", "--input", tmp_path / "in.txt",
                         "--output", tmp_path / "out.txt", "--chunk-lines", 7)
    assert files.returncode == 0, files.stderr
    assert (tmp_path / "out.txt").read_text().split("\n")[:-1] == greedy_jax


def test_split_sentences_nbest_and_beam_on_ctranslate2(run_dir, env, greedy_jax):
    paragraph = f"{LINES[0]} {LINES[1]}\n{LINES[2]}\n"
    split = translate_py(run_dir, env, *CT2, "--greedy", "--split-sentences", stdin=paragraph)
    assert split.stdout.split("\n")[:-1] == [f"{greedy_jax[0]} {greedy_jax[1]}", greedy_jax[2]]
    nbest = translate_py(run_dir, env, "--engine", "ctranslate2", "--nbest", 2, "--beam", 3,
                         stdin=f"{LINES[0]}\n\n{LINES[1]}\n")
    rows = [line.split("\t") for line in nbest.stdout.split("\n")[:-1]]
    assert [r[0] for r in rows] == ["0", "0", "1", "1", "2", "2"]
    assert float(rows[0][1]) >= float(rows[1][1]) and rows[2][1:] == ["0.0000", ""]


def test_evaluate_and_score_on_ctranslate2(run_dir, env, greedy_jax, tmp_path):
    source, reference = tmp_path / "test.de", tmp_path / "test.en"
    source.write_text("".join(f"{x}\n" for x in LINES))
    reference.write_text("".join(f"{x}\n" for x in sentences(len(LINES), seed=8)))
    test_set = ["--src-file", source, "--ref-file", reference]
    evaluated = translate_py(run_dir, env, *CT2, "--greedy", "--evaluate", *test_set,
                             "--hyp-file", tmp_path / "hyp.txt", "--report", tmp_path / "r.json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("BLEU = ") and "chrF2 = " in evaluated.stdout
    assert (tmp_path / "hyp.txt").read_text().split("\n")[:-1] == [t.rstrip() for t in greedy_jax]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["engine"] == "ctranslate2 float32"
    scores = {engine: translate_py(run_dir, env, "--score", *test_set, *flags)
              for engine, flags in (("jax", []), ("ctranslate2", CT2))}
    assert all(r.returncode == 0 for r in scores.values()), scores
    assert ([float(x) for x in scores["ctranslate2"].stdout.split()]
            == pytest.approx([float(x) for x in scores["jax"].stdout.split()], abs=2e-3))


@pytest.mark.parametrize("flags, message", [
    (["--engine", "ctranslate2", "--model", "second"], "CTranslate2 has no ensembles"),
    (["--engine", "ctranslate2", "--dtype", "bfloat16"], "--dtype does not apply with --engine "
                                                         "ctranslate2: give --compute-type"),
    (["--engine", "ctranslate2", "--plot-attention", "a.png"], "needs --engine jax"),
    (["--compute-type", "int8"], "--compute-type applies to --engine ctranslate2"),
    (["--threads", "2"], "--threads applies to --engine ctranslate2"),
    (["--engine", "ctranslate2", "--threads", "0"], "--threads must be 1 to 256, got 0"),
    (["--engine", "ctranslate2", "--threads", str(10**12)], "--threads must be 1 to 256"),
    (["--engine", "ctranslate2", "--searches", "100000"], "--searches 100000: CTranslate2"),
    (["--engine", "ctranslate2", "--threads", "1", "--searches", "4"],
     "--searches 4 with --threads 1: each batch translated at once takes a thread of its own; "
     "give --searches at most 1, or more --threads."),
    (["--engine", "ctranslate2", "--sample", "--searches", "2"],
     "--searches 2 with --sample: CTranslate2 samples one batch at a time"),
    (["--engine", "ctranslate2", "--compute-type", ""], "--compute-type : not a CTranslate2"),
    (["--engine", "ctranslate2", "--beam-rules", "exact"], "--beam-rules exact: CTranslate2's"),
    (["--engine", "ctranslate2", "--compute-type", "int4"], "not a CTranslate2 compute type"),
])
def test_what_the_engine_cannot_do_is_one_line(run_dir, flags, message, capsys, monkeypatch):
    from nmt.translation.command import main

    monkeypatch.setattr(sys, "stdin", None)
    assert main(["--model", str(run_dir), *flags, "Ein Hund."]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_missing_ctranslate2_ends_in_one_line(run_dir, capsys, monkeypatch):
    from nmt.translation.command import main

    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    assert main(["--model", str(run_dir), "--engine", "ctranslate2", "Ein Hund."]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install -e '.[ct2]'") and len(err.splitlines()) == 1, err


def test_a_model_ctranslate2_cannot_express_is_named_in_one_line(run_dir, tmp_path, capsys,
                                                                  monkeypatch):
    from flax import nnx

    from data.tokenizer import load_tokenizer
    from nmt.models.model_dir import export_model
    from nmt.translation.command import main
    from transformer.config import get_preset
    from transformer.model import Transformer

    tokenizer = load_tokenizer(run_dir / "model")
    # An odd width: CTranslate2's sinusoids, like MarianMT's, are sines then cosines.
    config = get_preset("tiny", vocab_size=tokenizer.vocab_size, d_model=21, num_heads=3)
    export_model(tmp_path / "odd", nnx.state(Transformer(config, rngs=nnx.Rngs(0)),
                                             nnx.Param), config, tokenizer)
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "stdin", None)
    assert main(["--model", str(tmp_path / "odd"), "--engine", "ctranslate2", "-q", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"translate.py: error: {tmp_path / 'odd'} cannot run on CTranslate2: d_model "
                   "21 is odd: CTranslate2's positional table needs an even model width. "
                   "Translate it with --engine jax."), err
    assert not [p for p in (tmp_path / "cache" / "ctranslate2").iterdir()
                if p.is_dir() and p.name != "checksums"]  # nothing half-written kept


def test_the_server_without_ctranslate2_ends_in_one_line(run_dir, capsys, monkeypatch):
    from nmt.serving.command import main

    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    assert main(["--model", str(run_dir), "--engine", "ctranslate2", "--port", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install -e '.[ct2]'") and len(err.splitlines()) == 1, err


def served(run_dir: Path, *flags: str):
    """The server's models for `flags` (its --model and --engine ctranslate2 given)."""
    from nmt.serving.command import build_parser, check_args, load_served_models

    args = build_parser().parse_args(["--model", str(run_dir), "--engine", "ctranslate2",
                                      "--port", "0", *flags])
    check_args(args)
    return load_served_models(args)


def test_the_server_searches_alternatives_without_min_len(cache, run_dir, caplog):
    """--greedy --min-len 2 serves: the alternatives (a beam search, which CTranslate2 cannot
    run with min_len) go without it and one warning says so; a beam flag CTranslate2 lacks
    is named as given, for the alternatives."""
    from nmt.runtime.cli import UsageError

    model = served(run_dir, "--greedy", "--min-len", "2")[0]
    assert (model.translator.search.min_len, model.alternatives.search.min_len) == (2, 0)
    assert model.alternatives.strategy.nbest == 4
    assert "--min-len 2: the alternatives (--alternatives-limit 3) are searched without it" \
        in caplog.text
    assert served(run_dir, "--greedy", "--min-len", "2", "--alternatives-limit", "0")[0] \
        .alternatives is None
    with pytest.raises(UsageError, match=r"--length-penalty gnmt: CTranslate2's beam search has "
                       r"only --length-penalty power; .* \(for the alternatives' beam search; "
                       r"--alternatives-limit 0 gives none\)$"):
        served(run_dir, "--greedy", "--length-penalty", "gnmt")


def test_the_server_takes_the_engines_searches_unless_given(cache, run_dir, caplog,
                                                             monkeypatch):
    """--searches not given is CTranslate2's choice, said nothing of: sampling searches one
    batch at a time and --threads 1 one batch; a number given is checked as translate.py
    checks it."""
    from nmt.engines import ctranslate2 as engine
    from nmt.runtime.cli import UsageError

    monkeypatch.setattr(engine, "cpu_cores", lambda: 4)
    for flags, searches in ((["--sample"], 1), (["--threads", "1"], 1), ([], 2),
                            (["--searches", "3"], 3)):
        caplog.clear()
        parsed = served(run_dir, *flags, "--alternatives-limit", "0")
        assert parsed[0].translator.searches == searches, flags
        assert "--searches" not in caplog.text, flags
    with pytest.raises(UsageError, match="--searches 2 with --sample"):
        served(run_dir, "--sample", "--searches", "2")


def test_the_server_refuses_buckets_and_warms_up_without_compiling(cache, run_dir, caplog):
    """--buckets, which only the JAX search reads, is refused in one line; the warm-up says
    it warms up (status and log), not that it compiled a batch shape."""
    import threading
    from types import SimpleNamespace

    from nmt.runtime.cli import UsageError
    from nmt.serving.command import warm_up

    with pytest.raises(UsageError, match=r"^--buckets does not apply with --engine "
                       r"ctranslate2: .*; drop --buckets\.$"):
        served(run_dir, "--buckets", "16,32")
    caplog.set_level(logging.INFO, logger="nmt.serving")
    [model] = served(run_dir, "--alternatives-limit", "0")
    service = SimpleNamespace(status="loading")
    seen = []
    warm = model.translator.warm_up
    model.translator.warm_up = lambda progress: (seen.append(service.status), warm(progress),
                                                 seen.append(service.status))
    warm_up([model], service, threading.Event())
    assert seen == [f"warming up {model.pair}"] * 2
    assert "compiled" not in caplog.text and f"{model.pair}: warmed up in" in caplog.text
