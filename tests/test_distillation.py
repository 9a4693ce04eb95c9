"""python -m nmt.distillation: the teacher's translations of a corpus, aligned with it, saved
chunk by chunk, resumed after an interruption, reused when asked again, and refused where
they would mix with another distillation."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from nmt.distillation import command
from nmt.distillation.output import DistillationDir, OtherDistillation, Recipe
from nmt.rundir.lock import RunLock
from transformer.config import SearchConfig
from translate_model import sentences

CORPUS_LINES = 30
CHUNK = ["--chunk-lines", "8"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    lines = sentences(CORPUS_LINES, seed=5)
    lines[11] = ""  # an empty source keeps its line
    (folder / "train.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "train.en").write_text("\n".join(s.upper() for s in sentences(CORPUS_LINES, 6))
                                     + "\n", encoding="utf-8")
    return folder / "train"


def distil(run_dir, corpus, out, *flags) -> int:
    return command.main(["--teacher", str(run_dir), "--train-prefix", str(corpus),
                         "--out", str(out), "-q", *CHUNK, *flags])


@pytest.fixture(scope="module")
def distilled(run_dir, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("distilled") / "out"
    assert distil(run_dir, corpus, out) == 0
    return out


def test_every_source_line_gets_the_teachers_translation_on_its_line(run_dir, corpus,
                                                                     distilled, capsys):
    import translate

    source = corpus.with_suffix(".de").read_text(encoding="utf-8")
    assert (distilled / "train.de").read_text(encoding="utf-8") == source
    targets = (distilled / "train.en").read_text(encoding="utf-8").splitlines()
    assert len(targets) == CORPUS_LINES and targets[11] == ""
    capsys.readouterr()
    assert translate.main(["--model", str(run_dir), "-q", "--input",
                           str(corpus.with_suffix(".de"))]) == 0
    assert capsys.readouterr().out.splitlines() == targets
    assert not (distilled / "parts").exists()
    recipe = json.loads((distilled / "distillation.json").read_text())
    assert recipe["search"]["size"] == 3 and recipe["chunk_lines"] == 8


def test_translations_that_reached_the_output_limit_are_named_by_corpus_line(run_dir,
                                                                             tmp_path, capsys):
    """Named as translate.py names them; the tiny model never ends a sentence, so every
    searched line (not the empty ones) reaches the limit."""
    import translate

    lines = [""] * CORPUS_LINES
    for number in (5, 27, 28, 29, 30):  # in the first and the last chunk
        lines[number - 1] = f"Satz {number}."
    (tmp_path / "sparse.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    limit = ["--max-len-a", "0", "--max-len-b", "3", "--greedy"]
    assert distil(run_dir, tmp_path / "sparse", tmp_path / "out", *limit) == 0
    ours = [line for line in capsys.readouterr().err.splitlines() if "output limit" in line]
    assert len(ours) == 1 and ours[0].startswith("distillation: 5 translation(s) reached the "
                                                 "output limit"), ours
    assert "line(s) 5, 27, 28, 29, 30; --max-len-a and --max-len-b raise the limit" in ours[0]
    assert translate.main(["--model", str(run_dir), "-q", "--input",
                           str(tmp_path / "sparse.de"), *limit]) == 0
    theirs = [line for line in capsys.readouterr().err.splitlines() if "output limit" in line]
    assert theirs[0].endswith(ours[0].split(": ", 1)[1]), (ours, theirs)


def test_an_interrupted_run_resumes_without_gaps_or_repeats(run_dir, corpus, distilled,
                                                            tmp_path, monkeypatch):
    write_part, written = DistillationDir.write_part, []

    def interrupted_after_two(self, chunk, translations, dropped=()):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(chunk)
        write_part(self, chunk, translations, dropped)

    monkeypatch.setattr(DistillationDir, "write_part", interrupted_after_two)
    out = tmp_path / "out"
    assert distil(run_dir, corpus, out) == 130
    assert sorted(p.name for p in (out / "parts").glob("*.en")) == ["000000.en", "000001.en"]
    assert not (out / "train.en").exists()
    # A part cut short (by an older chunking, or by hand) is translated again.
    (out / "parts" / "000001.en").write_text("one line only\n")
    written.clear()
    monkeypatch.setattr(DistillationDir, "write_part", lambda self, chunk, *rest: (
        written.append(chunk), write_part(self, chunk, *rest)))
    assert distil(run_dir, corpus, out) == 0
    assert written == [1, 2, 3]
    for name in ("train.de", "train.en"):
        assert (out / name).read_bytes() == (distilled / name).read_bytes()


def test_a_sampled_distillation_resumes_to_the_uninterrupted_runs_files(run_dir, corpus,
                                                                        tmp_path, monkeypatch):
    """Each chunk draws from the seed and its own number, not from a count of the batches
    this process searched, which a resumed run starts again from 0."""
    sample = ["--sample", "--temperature", "5", "--seed", "5"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert distil(run_dir, corpus, straight, *sample) == 0
    write_part = DistillationDir.write_part

    def interrupted_after_two(self, chunk, translations, dropped=()):
        if chunk == 2:
            raise KeyboardInterrupt
        write_part(self, chunk, translations, dropped)

    monkeypatch.setattr(DistillationDir, "write_part", interrupted_after_two)
    assert distil(run_dir, corpus, resumed, *sample) == 130
    monkeypatch.setattr(DistillationDir, "write_part", write_part)
    assert distil(run_dir, corpus, resumed, *sample) == 0
    assert (resumed / "train.en").read_bytes() == (straight / "train.en").read_bytes()


def test_a_finished_distillation_is_reused_and_another_recipe_refused(run_dir, corpus,
                                                                     distilled, tmp_path,
                                                                     monkeypatch, capsys):
    out = shutil.copytree(distilled, tmp_path / "out")
    before = (out / "train.en").read_bytes()
    monkeypatch.setattr(command, "make_translator", lambda *a: pytest.fail("translated again"))
    assert distil(run_dir, corpus, out) == 0
    assert distil(run_dir, corpus, out, "--chunk-lines", "5") == 0  # the files are the same
    assert (out / "train.en").read_bytes() == before
    capsys.readouterr()
    assert distil(run_dir, corpus, out, "--beam", "2") == 2
    err = capsys.readouterr().err
    assert "holds another distillation (its search differs" in err and len(err.splitlines()) == 1
    other = tmp_path / "other"
    shutil.copytree(corpus.parent, other)
    with open(other / "train.de", "a", encoding="utf-8") as f:
        f.write("Ein neuer satz.\n")
    assert distil(run_dir, other / "train", out) == 2
    assert "its corpus differs" in capsys.readouterr().err


def test_search_settings_the_strategy_never_reads_reuse_the_output(run_dir, corpus, tmp_path,
                                                                    monkeypatch, capsys):
    """Beam flags under --greedy change nothing, and neither does a recipe stored whole (as
    before the search was narrowed to what runs); another strategy is another search."""
    out = tmp_path / "out"
    assert distil(run_dir, corpus, out, "--greedy") == 0
    monkeypatch.setattr(command, "make_translator", lambda *a: pytest.fail("translated again"))
    assert distil(run_dir, corpus, out, "--greedy", "--beam", "1", "--alpha", "0.9",
                  "--beam-rules", "exact") == 0
    recipe_file = out / "distillation.json"
    stored = json.loads(recipe_file.read_text())
    assert stored["search"]["strategy"] == "greedy" and "alpha" not in stored["search"]
    old = {**stored, "search": {**SearchConfig().to_dict(), "strategy": "greedy", "beam_size": 3,
                                "max_len_a": 1.5, "max_len_b": 15}}
    recipe_file.write_text(json.dumps(old))
    assert distil(run_dir, corpus, out, "--greedy", "--max-len-a", "1.5", "--max-len-b",
                  "15") == 0
    capsys.readouterr()
    for flags in (["--greedy", "--max-len-b", "16"], ["--beam", "1", "--max-len-a", "1.5",
                                                      "--max-len-b", "15"]):
        assert distil(run_dir, corpus, out, *flags) == 2
        err = capsys.readouterr().err
        assert "holds another distillation (its search differs" in err, flags
        assert len(err.splitlines()) == 1


def test_a_second_distillation_into_an_out_in_use_is_refused_in_one_line(run_dir, corpus,
                                                                        tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    with RunLock(out, "distillation", "--out"):  # a first command, distilling into OUT
        assert distil(run_dir, corpus, out, "--greedy") == 1
        err = capsys.readouterr().err.strip()
        assert f"{out} is in use by another distillation (pid {os.getpid()} on " in err, err
        assert "choose another --out" in err and len(err.splitlines()) == 1
        assert [path.name for path in out.iterdir()] == [".lock"]  # nothing claimed
    assert distil(run_dir, corpus, out, "--greedy") == 0  # once it is done
    assert len((out / "train.en").read_text(encoding="utf-8").splitlines()) == CORPUS_LINES


def test_an_out_on_a_filesystem_without_locks_is_refused_in_one_line(run_dir, corpus, tmp_path,
                                                                     capsys, monkeypatch):
    """NFS without a lock daemon answers flock with ENOLCK: a usage error naming OUT's lock."""
    import errno
    import fcntl

    out = tmp_path / "out"

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert distil(run_dir, corpus, out, "--greedy") == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot lock {out / '.lock'}: the filesystem of {out} does not support" in err, err
    assert "put --out on a local disk" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_finished_distillation_on_read_only_storage_is_answered_without_the_lock(
        run_dir, corpus, distilled, tmp_path, monkeypatch, capsys, code):
    """A finished OUT is only read: read-only storage, where its lock cannot be taken, still
    answers it (and refuses another recipe); an unfinished one names the lock it cannot take."""
    out = shutil.copytree(distilled, tmp_path / "out")
    before = sorted((path.name, path.read_bytes()) for path in out.iterdir() if path.is_file())
    real_open = os.open

    def read_only(path, flags, *args):
        if os.fspath(path).endswith(".lock"):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    monkeypatch.setattr(command, "make_translator", lambda *a: pytest.fail("translated again"))
    assert distil(run_dir, corpus, out) == 0
    assert sorted((path.name, path.read_bytes()) for path in out.iterdir()
                  if path.is_file()) == before
    capsys.readouterr()
    assert distil(run_dir, corpus, out, "--beam", "2") == 2
    err = capsys.readouterr().err.strip()
    assert "holds another distillation (its search differs" in err and len(err.splitlines()) == 1
    assert distil(run_dir, corpus, tmp_path / "new") == 1
    err = capsys.readouterr().err.strip()
    assert f"error: {tmp_path / 'new' / '.lock'}: " in err and len(err.splitlines()) == 1, err


def test_original_pairs_kept_come_first(run_dir, corpus, tmp_path, capsys):
    """With --keep-original, the corpus is for a model of the teacher's size (two stages),
    and the closing hint says so, naming no student preset."""
    out = tmp_path / "out"
    assert distil(run_dir, corpus, out, "--keep-original") == 0
    hint = capsys.readouterr().err
    assert "train a model of the teacher's size" in hint and "student" not in hint, hint
    source = corpus.with_suffix(".de").read_text(encoding="utf-8").splitlines()
    original = corpus.with_suffix(".en").read_text(encoding="utf-8").splitlines()
    assert (out / "train.de").read_text(encoding="utf-8").splitlines() == source + source
    targets = (out / "train.en").read_text(encoding="utf-8").splitlines()
    assert len(targets) == 2 * CORPUS_LINES and targets[:CORPUS_LINES] == original


def test_lines_too_long_for_the_teacher_are_left_out_with_one_warning(run_dir, corpus, tmp_path,
                                                                     monkeypatch, capsys):
    """Cut to the model's 64 positions, a line would be paired with the translation of its
    start: it is left out of both files, counted once, and a resumed run writes the same."""
    lines = corpus.with_suffix(".de").read_text(encoding="utf-8").splitlines()
    long = " ".join(sentences(40, seed=9))  # far over 63 tokens
    for number in (3, 9, 10, 30):  # in the first, second and last chunk
        lines[number - 1] = long
    (tmp_path / "long.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept = [line for n, line in enumerate(lines, 1) if n not in (3, 9, 10, 30)]
    (tmp_path / "short.de").write_text("\n".join(kept) + "\n", encoding="utf-8")
    assert distil(run_dir, tmp_path / "short", tmp_path / "short_out", "--greedy") == 0
    write_part = DistillationDir.write_part

    def interrupted_after_one(self, chunk, translations, dropped=()):
        if chunk == 1:
            raise KeyboardInterrupt
        write_part(self, chunk, translations, dropped)

    monkeypatch.setattr(DistillationDir, "write_part", interrupted_after_one)
    out = tmp_path / "out"
    assert distil(run_dir, tmp_path / "long", out, "--greedy") == 130
    monkeypatch.setattr(DistillationDir, "write_part", write_part)
    capsys.readouterr()
    assert distil(run_dir, tmp_path / "long", out, "--greedy") == 0
    warnings = capsys.readouterr().err.splitlines()
    assert not [w for w in warnings if "truncated" in w or "cut to" in w], warnings
    ours = [w for w in warnings if "left out" in w]
    assert len(ours) == 1 and ours[0].startswith(
        f"distillation: 4 line(s) of {tmp_path / 'long.de'} longer than the teacher's "
        "positions"), warnings
    assert "line(s) 3, 9, 10, 30;" in ours[0]
    assert (out / "train.de").read_text(encoding="utf-8").splitlines() == kept
    assert (out / "train.en").read_bytes() == (tmp_path / "short_out" / "train.en").read_bytes()


def test_finishing_leaves_the_dropped_lines_out_of_the_distilled_pairs_only(tmp_path):
    out = DistillationDir(tmp_path / "out", recipe(chunk_lines=2, keep_original=True))
    out.claim()
    out.write_part(0, ["A", ""], dropped=[2])
    out.write_part(1, ["", "D"], dropped=[3])
    assert out.done_part(0, 2) and not out.done_part(2, 2)
    assert out.finish(2, lambda: ["a", "b", "c", "d"], lambda: ["1", "2", "3", "4"]) == [2, 3]
    assert out.source_file.read_text().splitlines() == ["a", "b", "c", "d", "a", "d"]
    assert out.target_file.read_text().splitlines() == ["1", "2", "3", "4", "A", "D"]


def teacher_copy(run_dir, tmp_path, name: str, **stored) -> str:
    """A copy of the tiny model whose config.json stores other values."""
    copy = shutil.copytree(run_dir / "model", tmp_path / name)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **stored}))
    return str(copy)


@pytest.mark.parametrize("case, code, message", [
    ("flags-languages", 2, "--tgt fr, but --teacher"),
    ("teachers-languages", 2, "translates de->fr but --teacher"),
    ("missing-corpus", 1, "does not exist; --train-prefix PREFIX reads PREFIX.de"),
    ("empty-corpus", 1, "empty.de is empty: there is nothing to distil"),
    ("not-empty", 2, "is not empty and holds no distillation.json"),
    ("nbest", 2, "keeps the teacher's best translation only"),
    ("chunk", 2, "--chunk-lines must be >= 1, got 0"),
    ("batch", 2, "--batch-tokens must be >= 1, got -3"),
    # Found before the teacher loads and before --out is made, not as an unexpected error
    # after the first chunks were translated.
    ("source-not-utf8", 1, "bad.de line 3: invalid UTF-8 (byte 0xff at column 5)"),
    ("target-not-utf8", 1, "bad.en line 3: invalid UTF-8"),
    ("misaligned", 1, "bad.de has 30 lines but"),
    ("one-language", 2, "source and target are both 'de': the distilled corpus's two files"),
    # A blank language read as left out (the teacher's), a blank path as the current directory.
    ("blank-language", 2, "argument --src: '' is blank"),
    ("blank-out", 2, "argument --out: '' is blank"),
])
def test_bad_input_is_one_line(run_dir, corpus, tmp_path, capsys, case, code, message):
    out, flags, teachers = tmp_path / "out", [], ["--teacher", str(run_dir)]
    prefix = str(corpus)
    if case == "flags-languages":
        flags = ["--tgt", "fr"]
    elif case == "teachers-languages":
        teachers += ["--teacher", teacher_copy(run_dir, tmp_path, "fr", target_lang="fr")]
    elif case == "missing-corpus":
        prefix = str(tmp_path / "nothing")
    elif case == "empty-corpus":
        (tmp_path / "empty.de").write_bytes(b"")
        prefix = str(tmp_path / "empty")
    elif case == "not-empty":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "nbest":
        flags = ["--nbest", "2"]
    elif case == "chunk":
        flags = ["--chunk-lines", "0"]
    elif case == "batch":
        flags = ["--batch-tokens", "-3"]
    elif case == "blank-language":
        flags = ["--src", ""]
    elif case == "blank-out":
        flags = ["--out", ""]  # the later --out wins
    elif case == "one-language":  # a teacher that rewrites its language
        teachers = ["--teacher", teacher_copy(run_dir, tmp_path, "de", target_lang="de")]
    else:
        prefix = _damaged_copy(corpus, tmp_path, case)
        flags = ["--keep-original"]
    argv = [*teachers, "--train-prefix", prefix, "--out", str(out), "-q", *flags]
    try:
        status = command.main(argv)
    except SystemExit as parser_exit:  # argparse's own checks
        status = parser_exit.code
    assert status == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    if case == "not-empty":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    else:
        assert not out.exists()


def _damaged_copy(corpus, tmp_path, case: str) -> str:
    """The corpus as tmp_path/bad.{de,en}, with one side's line 3 in Latin-1 bytes or with a
    line missing from the target."""
    for side in ("de", "en"):
        lines = corpus.with_suffix(f".{side}").read_bytes().splitlines(keepends=True)
        if case == f"{'source' if side == 'de' else 'target'}-not-utf8":
            lines[2] = b"Wie \xff gut\n"
        if case == "misaligned" and side == "en":
            del lines[4]
        (tmp_path / f"bad.{side}").write_bytes(b"".join(lines))
    return str(tmp_path / "bad")


def test_an_ensemble_of_teachers_distils_with_their_mean(run_dir, corpus, tmp_path):
    out = tmp_path / "out"
    second = teacher_copy(run_dir, tmp_path, "second")
    assert command.main(["--teacher", str(run_dir), "--teacher", second, "--train-prefix",
                         str(corpus), "--out", str(out), "-q", "--chunk-lines", "64",
                         "--greedy"]) == 0  # greedy: the ensemble's programs compile sooner
    recipe = json.loads((out / "distillation.json").read_text())
    assert len(recipe["teachers"]) == 2 and recipe["search"]["strategy"] == "greedy"
    assert len((out / "train.en").read_text(encoding="utf-8").splitlines()) == CORPUS_LINES


def test_a_teacher_storing_no_languages_does_not_hide_the_next_ones(run_dir, corpus, tmp_path,
                                                                    capsys):
    """The languages stored by any teacher are checked, whatever the order: a first teacher
    without them left a later de->en one unchecked, and an English corpus was distilled."""
    config = json.loads((run_dir / "model" / "config.json").read_text())
    bare = teacher_copy(run_dir, tmp_path, "bare")
    config = {k: v for k, v in config.items() if k not in ("source_lang", "target_lang")}
    (tmp_path / "bare" / "config.json").write_text(json.dumps(config))
    assert command.read_teachers([bare], "en", "de")[1:] == ("en", "de")
    for teachers in ([bare, str(run_dir)], [str(run_dir), bare]):
        with pytest.raises(command.UsageError,
                           match=rf"--src en, but --teacher {run_dir} was trained with --src de"):
            command.read_teachers(teachers, "en", "de")
        assert command.read_teachers(teachers, None, None)[1:] == ("de", "en")
    french = teacher_copy(run_dir, tmp_path, "fr", target_lang="fr")
    out = tmp_path / "out"
    assert command.main(["--teacher", bare, "--teacher", str(run_dir), "--teacher", french,
                         "--train-prefix", str(corpus), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--teacher {french} translates de->fr but --teacher {run_dir} translates de->en" \
        in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_teachers_of_two_dtypes_are_recorded_and_described_as_both(run_dir, tmp_path):
    """The recipe recorded the first teacher's dtype alone, so a rerun with --dtype float32
    (which computes otherwise) was taken for the same distillation."""
    from nmt.models.model_dir import load_models
    from nmt.models.translator import Translator
    from transformer.config import SearchConfig

    config = json.loads((run_dir / "model" / "config.json").read_text())
    bfloat16 = teacher_copy(run_dir, tmp_path, "bf16",
                            model={**config["model"], "dtype": "bfloat16"})
    teachers, _, _ = command.read_teachers([str(run_dir), bfloat16, str(run_dir)], None, None)
    assert teachers.dtypes == "float32+bfloat16"
    model, tokenizer, _ = load_models([str(run_dir), bfloat16])
    assert Translator(model, tokenizer, SearchConfig(strategy="greedy")).describe() == \
        "jax float32+bfloat16"
    model, tokenizer, _ = load_models([str(run_dir), bfloat16], dtype="float32")
    assert Translator(model, tokenizer, SearchConfig(strategy="greedy")).compute_type == \
        "float32"


def test_teachers_of_two_spm_models_are_refused_before_out_is_claimed(run_dir, corpus,
                                                                      tmp_path, capsys):
    from data.tokenizer import TokenizerConfig, train_tokenizer

    other = shutil.copytree(run_dir / "model", tmp_path / "other")
    tokenizer = train_tokenizer(sentences(300, seed=7), TokenizerConfig(vocab_size=300))
    tokenizer.save(other)
    config = json.loads((other / "config.json").read_text())  # a model of its own tokenizer
    (other / "config.json").write_text(json.dumps({**config,
                                                   "tokenizer_sha256": tokenizer.sha256}))
    out = tmp_path / "out"
    assert distil(run_dir, corpus, out, "--teacher", str(other)) == 2
    err = capsys.readouterr().err.strip()
    assert f"--teacher {other} has another SentencePiece model than --teacher {run_dir}" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def recipe(**fields) -> Recipe:
    return Recipe(**{"teachers": ("a",), "corpus": "c", "src": "de", "tgt": "en",
                     "search": {}, "dtype": "float32", "chunk_lines": 8,
                     "keep_original": False, **fields})


def test_a_recipe_with_nothing_translated_is_replaced_and_one_with_parts_refused(tmp_path):
    out = tmp_path / "out"
    DistillationDir(out, recipe()).claim()  # a command refused after claiming OUT
    (out / "parts").mkdir()
    DistillationDir(out, recipe(teachers=("b",))).claim()  # the corrected command
    assert json.loads((out / "distillation.json").read_text())["teachers"] == ["b"]
    DistillationDir(out, recipe(teachers=("b",))).write_part(0, ["x"])
    for other, differs in ((recipe(), "its teachers differ from"),
                           (recipe(teachers=("b",), corpus="d"), "its corpus differs from"),
                           (recipe(corpus="d", seed=1), "its teachers, corpus and --seed differ")):
        with pytest.raises(OtherDistillation, match=differs):
            DistillationDir(out, other).claim()


def test_another_chunk_size_is_refused_while_unfinished_and_reused_once_finished(tmp_path):
    """An unfinished output's parts are numbered in chunks of its size: with another size, a
    part of the expected length could hold other lines' translations."""
    out = tmp_path / "out"
    DistillationDir(out, recipe()).claim()
    DistillationDir(out, recipe()).write_part(0, ["x"])
    with pytest.raises(OtherDistillation, match=r"holds an unfinished distillation saved in "
                                                r"chunks of 8 lines; continue it with "
                                                r"--chunk-lines 8, or choose another --out"):
        DistillationDir(out, recipe(chunk_lines=4)).claim()
    with pytest.raises(OtherDistillation, match=r"\(its --dtype, --chunk-lines and "
                                                r"--keep-original differ from"):
        DistillationDir(out, recipe(chunk_lines=4, dtype="bfloat16", keep_original=True)).claim()
    DistillationDir(out, recipe()).finish(1, lambda: ["a"], None)
    DistillationDir(out, recipe(chunk_lines=4)).claim()
    with pytest.raises(OtherDistillation, match=r"\(its --dtype and --keep-original differ"):
        DistillationDir(out, recipe(chunk_lines=4, dtype="bfloat16", keep_original=True)).claim()


def test_finishing_with_no_part_writes_the_files_without_parts(tmp_path):
    out = DistillationDir(tmp_path / "out", recipe())
    out.claim()
    out.finish(0, lambda: [], None)
    assert out.finished() and out.target_file.read_bytes() == b""


def test_sampling_draws_from_the_seed_and_another_seed_is_another_recipe(run_dir, corpus,
                                                                         distilled, tmp_path,
                                                                         capsys):
    sample = ["--sample", "--temperature", "5"]
    outputs = {}
    for seed in ("1", "999"):
        out = tmp_path / seed
        assert distil(run_dir, corpus, out, *sample, "--seed", seed) == 0
        outputs[seed] = (out / "train.en").read_bytes()
    assert outputs["1"] != outputs["999"]
    assert json.loads((tmp_path / "1" / "distillation.json").read_text())["seed"] == 1
    capsys.readouterr()
    assert distil(run_dir, corpus, tmp_path / "1", *sample, "--seed", "999") == 2
    err = capsys.readouterr().err
    assert "holds another distillation (its --seed differs" in err and len(err.splitlines()) == 1
    # Beam search draws nothing: its output is reused whatever the seed.
    assert distil(run_dir, corpus, shutil.copytree(distilled, tmp_path / "beam"),
                  "--seed", "7") == 0
