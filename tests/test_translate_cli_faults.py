"""translate.py's input and output under hostile use: nothing lost, nothing silently wrong.

Two runs writing one output, an output that is an input, a line without end, pipes given as
files, NaN and infinite settings (flags, recipes, stored model directories) and a MarianMT
directory given as a model. The checks that end before a model loads run in this process;
the runs that translate are subprocesses on the tiny model of tests/translate_model.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import train as train_cli
from data import lines
from data.config import DataError
from nmt.runtime import files
from nmt.settings.config import SECTIONS
from nmt.training import command as train_command
from nmt.translation import command as translate_cli
from translate_model import sentences

REPO = Path(__file__).resolve().parents[1]


def _main(main, argv: list, capsys) -> tuple[int, str]:
    """main(argv)'s exit status (argparse's exit included) and its one stderr line."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit_info:
        status = exit_info.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in err, err
    return status, errors[0]


@pytest.fixture
def no_model(monkeypatch):
    """Fails a test that loads a model: the error must come before."""
    def load():
        raise AssertionError("the model must not be loaded before this error")

    monkeypatch.setattr(translate_cli, "enable_compilation_cache", load)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ------------------------------------------------------------------------ one output, two writers


def test_two_writers_of_one_file_have_their_own_temporaries_and_the_later_is_refused(tmp_path):
    out = tmp_path / "same.out"
    out.write_text("before\n")
    with pytest.raises(files.ChangedMeanwhile) as info:
        with files.atomic_file(out) as first:
            first.write("first\n")
            with files.atomic_file(out) as second:  # as another process would
                second.write("second\n")
                assert _names(tmp_path) == ["same.out", "same.out.partial",
                                            "same.out.partial.1"]
            assert out.read_text() == "second\n"
            first.write("more of the first\n")
    # The first finished later: it must not replace what the second wrote meanwhile.
    kept = tmp_path / "same.out.kept"
    assert f"{out} was written by another process" in str(info.value)
    assert f"this run's complete output is in {kept}" in str(info.value)
    assert out.read_text() == "second\n"
    assert kept.read_text() == "first\nmore of the first\n"
    assert _names(tmp_path) == ["same.out", "same.out.kept"]  # no temporary left


def test_a_file_changed_since_the_run_began_is_not_replaced(tmp_path):
    out = tmp_path / "out.txt"
    began = files.file_state(out)  # absent when the run began
    out.write_text("written by another run\n")
    with pytest.raises(files.ChangedMeanwhile):
        files.write_atomically(out, "ours\n", since=began)
    assert out.read_text() == "written by another run\n"
    assert (tmp_path / "out.txt.kept").read_text() == "ours\n"
    files.write_atomically(out, "replaced\n", since=files.file_state(out))
    assert out.read_text() == "replaced\n"


def test_a_killed_writers_temporary_is_reclaimed_and_a_fresh_one_left_alone(tmp_path):
    out = tmp_path / "out.txt"
    stale = files.partial_path(out)
    stale.write_text("half of a run killed with SIGKILL")
    old = time.time() - files.ABANDONED_AFTER - 10
    os.utime(stale, (old, old))
    stale_other = files.partial_path(out, 3)
    stale_other.write_text("another")
    os.utime(stale_other, (old, old))
    files.write_atomically(out, "new\n")
    assert _names(tmp_path) == ["out.txt"] and out.read_text() == "new\n"
    # Unlocked but just written: perhaps created by a writer that has not locked it yet.
    stale.write_text("fresh")
    files.write_atomically(out, "newer\n")
    assert _names(tmp_path) == ["out.txt", "out.txt.partial"] and out.read_text() == "newer\n"


def test_a_failure_of_the_second_writer_leaves_the_first_ones_temporary(tmp_path):
    out = tmp_path / "out.txt"
    with files.atomic_file(out) as first:
        first.write("first\n")
        with pytest.raises(KeyboardInterrupt):
            with files.atomic_file(out) as second:
                second.write("half")
                raise KeyboardInterrupt
        assert _names(tmp_path) == ["out.txt.partial"]
    assert _names(tmp_path) == ["out.txt"] and out.read_text() == "first\n"


def _fifo_writer(path: Path, text: str, release: threading.Event) -> threading.Thread:
    """A thread that writes `text` into the FIFO `path`, then waits for `release` to close
    it (the reader sees the end of input only then)."""
    def write():
        with open(path, "w") as fifo:  # blocks until the reader opens it
            fifo.write(text)
            fifo.flush()
            release.wait(300)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_two_translate_runs_with_one_output_do_not_mix(run_dir, env, tmp_path):
    """Run 1 reads a pipe that stays open until run 2, started later, has finished and
    written OUT; run 1 then ends with one line, keeping run 2's OUT and its own result."""
    fifo, second_input, out = tmp_path / "a.fifo", tmp_path / "b.de", tmp_path / "same.out"
    os.mkfifo(fifo)
    second_input.write_text("".join(s + "\n" for s in sentences(5, seed=4)))
    release = threading.Event()
    writer = _fifo_writer(fifo, "".join(s + "\n" for s in sentences(3, seed=3)), release)
    command = [sys.executable, "translate.py", "--model", str(run_dir), "--greedy", "-q",
               "--output", str(out)]
    first = subprocess.Popen([*command, "--input", str(fifo)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        partial = files.partial_path(out)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            if partial.exists() and partial.read_text().count("\n") == 3:
                break
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()[1][-2000:]
        second = subprocess.run([*command, "--input", str(second_input)], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=240)
        assert second.returncode == 0, second.stderr
        assert out.read_text().count("\n") == 5
        assert partial.read_text().count("\n") == 3  # the second wrote a temporary of its own
    finally:
        release.set()
        writer.join(60)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 1
    line = err.strip().splitlines()[-1]
    kept = tmp_path / "same.out.kept"
    assert line.startswith(f"translate.py: error: {out} was written by another process")
    assert str(kept) in line
    assert out.read_text().count("\n") == 5 and kept.read_text().count("\n") == 3
    assert _names(tmp_path) == ["a.fifo", "b.de", "same.out", "same.out.kept"]


# ----------------------------------------------------------------------------- output = input


@pytest.mark.parametrize("how", ["same path", "another path", "symbolic link", "hard link"])
def test_output_that_is_the_input_is_refused_before_anything_is_written(how, tmp_path,
                                                                        capsys, no_model):
    source = tmp_path / "x.en"
    source.write_text("A man.\n")
    output = {"same path": source, "another path": tmp_path / "." / "sub" / ".." / "x.en",
              "symbolic link": tmp_path / "link.en", "hard link": tmp_path / "hard.en"}[how]
    (tmp_path / "sub").mkdir()
    if how == "symbolic link":
        output.symlink_to(source)
    elif how == "hard link":
        os.link(source, output)
    status, line = _main(translate_cli.main, ["--model", "m", "--input", source,
                                              "--output", output], capsys)
    assert status == 2
    assert f"--output {output}: is the same file as --input {source}" in line
    assert source.read_text() == "A man.\n"
    assert not files.partial_paths(source) and not files.partial_paths(output)


@pytest.mark.parametrize("flags,named", [
    (["--hyp-file", "{ref}"], "--hyp-file {ref}: is the same file as --ref-file {ref}"),
    (["--report", "{src}"], "--report {src}: is the same file as --src-file {src}"),
    (["--output", "{ref}"], "--output {ref}: is the same file as --ref-file {ref}"),
    (["--hyp-file", "{tmp}/h", "--report", "{tmp}/h"],
     "--report {tmp}/h: is the same file as --hyp-file {tmp}/h"),
])
def test_evaluation_outputs_that_are_inputs_are_refused(flags, named, tmp_path, capsys,
                                                       no_model):
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Mann.\n")
    ref.write_text("A man.\n")

    def fill(text: str) -> str:
        return text.replace("{src}", str(src)).replace("{ref}", str(ref)).replace(
            "{tmp}", str(tmp_path))

    status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--src-file", src,
                                              "--ref-file", ref, *map(fill, flags)], capsys)
    assert status == 2 and fill(named) in line
    assert src.read_text() == "Ein Mann.\n" and ref.read_text() == "A man.\n"


@pytest.mark.parametrize("flags", [
    ["--output", "{src}"],
    ["--input", "-", "--output", "{src}"],
    ["--evaluate", "--src-file", "-", "--ref-file", "{ref}", "--hyp-file", "{src}"],
])
def test_an_output_that_is_the_file_on_standard_input_is_refused(flags, tmp_path, capsys,
                                                                 monkeypatch, no_model):
    """`translate.py --output x.de < x.de` would replace the text it reads."""
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Mann.\n")
    ref.write_text("A man.\n")
    fill = {"{src}": str(src), "{ref}": str(ref)}
    with open(src) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        status, line = _main(translate_cli.main, ["--model", "m", *[fill.get(flag, flag)
                                                                    for flag in flags]], capsys)
        assert status == 2
        assert f"{src}: is the file standard input reads" in line
        assert src.read_text() == "Ein Mann.\n"
        status, line = _main(translate_cli.main, ["--model", "m", "--output",
                                                  tmp_path / "other.en"], capsys)
    assert "standard input" not in line and "--model m: no such directory" in line


def test_an_output_that_is_a_test_prefix_file_is_refused(tmp_path):
    from nmt.translation import evaluation

    (tmp_path / "t.de").write_text("Ein Mann.\n")
    (tmp_path / "t.en").write_text("A man.\n")
    args = translate_cli.build_parser().parse_args(
        ["--model", "m", "--evaluate", "--test-prefix", str(tmp_path / "t"), "--hyp-file",
         str(tmp_path / "t.en")])
    with pytest.raises(translate_cli.UsageError, match=r"--hyp-file .*t\.en: is the same file"):
        evaluation.evaluation_data(args, {"source_lang": "de", "target_lang": "en"})


@pytest.mark.parametrize("argv,named", [
    (["--output", "{tmp}/missing/out.txt", "Hallo."], "directory {tmp}/missing does not exist"),
    (["--output", "{tmp}", "Hallo."], "--output {tmp}: is a directory"),
])
def test_a_bad_output_path_is_a_usage_error(argv, named, tmp_path, capsys, no_model):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    status, line = _main(translate_cli.main, ["--model", "m", *argv], capsys)
    assert status == 2 and named.replace("{tmp}", str(tmp_path)) in line


# ----------------------------------------------------------------------------- long lines


def _sparse(path: Path, size: int, before: bytes = b"") -> Path:
    """`before`, then a line of `size` NUL bytes without a line break (no disk space used)."""
    path.write_bytes(before)
    os.truncate(path, len(before) + size)
    return path


def test_a_line_without_end_is_read_in_linear_time_and_refused_with_its_number(tmp_path):
    """50 MB of one line: refused after the lines before it, having read a few MB. The
    earlier reader copied the line on every read (`partial + data`): minutes for a few
    hundred MB. Bounded by size: it ends as soon as reading is linear."""
    path = _sparse(tmp_path / "long.en", 50 << 20, before=b"one\ntwo\n")
    with open(path, "rb") as handle:
        chunks = lines.stream_chunks(handle.fileno(), max_lines=1000, where=str(path))
        assert next(chunks) == (1, ["one", "two"])
        with pytest.raises(DataError, match=rf"{path} line 3: longer than {lines.MAX_LINE_BYTES}"
                                            r" bytes \(4 MiB\)"):
            next(chunks)
        assert handle.tell() < 2 * lines.MAX_LINE_BYTES  # stopped reading at the limit
    read = iter(lines.iter_lines(path))
    assert [next(read), next(read)] == ["one", "two"]
    with pytest.raises(DataError, match=rf"{path} line 3: longer than"):
        next(read)
    assert lines.count_lines(path) == 3


def test_a_long_line_under_a_raised_limit_is_read_whole(tmp_path):
    path = tmp_path / "long.en"
    path.write_bytes(b"x" * (50 << 20))  # text: a line of NUL bytes is refused
    with open(path, "rb") as handle:
        (first, [line]), = lines.stream_chunks(handle.fileno(), 10, max_line_bytes=64 << 20)
    assert first == 1 and len(line) == 50 << 20


@pytest.mark.parametrize("size,ok", [(10, True), (11, False)])
def test_the_line_limit_is_exact_wherever_the_reads_end(size, ok, tmp_path):
    text = b"a\n" + b"x" * size + b"\r\nb\n"
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    limit = 11  # bytes before the "\n": "\r" counts
    for read_size in (1, 3, 64):
        read_fd, write_fd = os.pipe()
        for start in range(0, len(text), read_size):
            os.write(write_fd, text[start:start + read_size])
        os.close(write_fd)
        chunks = lines.stream_chunks(read_fd, 100, max_line_bytes=limit)
        try:
            if ok:
                assert [line for _, chunk in chunks for line in chunk] == ["a", "x" * size, "b"]
            else:
                assert next(chunks) == (1, ["a"])
                with pytest.raises(DataError, match="line 2: longer than"):
                    next(chunks)
        finally:
            os.close(read_fd)
    if ok:
        assert list(lines.iter_lines(path, max_line_bytes=limit)) == ["a", "x" * size, "b"]
    else:
        with pytest.raises(DataError, match="line 2: longer than"):
            list(lines.iter_lines(path, max_line_bytes=limit))


def test_translate_refuses_a_line_without_end_before_loading(tmp_path, capsys, no_model):
    path = _sparse(tmp_path / "s.en", 200 << 20, before=b"A man.\n")
    status, line = _main(translate_cli.main, ["--model", "m", "--input", path, "--output",
                                              tmp_path / "o"], capsys)
    assert status == 1 and f"{path} line 2: longer than" in line
    assert _names(tmp_path) == ["s.en"]


# ----------------------------------------------------------------------------- pipes


def test_lines_of_a_fifo_are_read(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    release = threading.Event()
    release.set()
    writer = _fifo_writer(fifo, "a\nb\n", release)
    assert lines.read_lines(fifo) == ["a", "b"]
    writer.join(10)
    with pytest.raises(DataError, match="is a directory"):
        lines.read_lines(tmp_path)


def test_translate_reads_a_process_substitution(run_dir, env, tmp_path):
    source = tmp_path / "f.de"
    source.write_text("".join(s + "\n" for s in sentences(4, seed=2)))
    translate = f'"{sys.executable}" translate.py --model "{run_dir}" --greedy -q'
    result = subprocess.run(
        ["bash", "-c", f'{translate} --input <(head -2 "{source}") && '
                       f'head -2 "{source}" | {translate}'],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 4 and outputs[:2] == outputs[2:]  # as the same lines on stdin


def test_evaluation_reads_a_fifo_and_dev_stdin(run_dir, env, tmp_path):
    fifo = tmp_path / "src.fifo"
    os.mkfifo(fifo)
    src = "".join(s + "\n" for s in sentences(3, seed=6))
    release = threading.Event()
    release.set()
    writer = _fifo_writer(fifo, src, release)
    try:
        result = subprocess.run(
            [sys.executable, "translate.py", "--model", str(run_dir), "--greedy", "-q",
             "--evaluate", "--src-file", str(fifo), "--ref-file", "/dev/stdin"],
            cwd=REPO, env=env, input="A man.\nA dog.\nA cat.\n", capture_output=True,
            text=True, timeout=240)
    finally:
        if writer.is_alive():  # the run failed before opening the FIFO
            with open(fifo, "rb"):
                pass
        writer.join(10)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("BLEU = ")


def test_a_test_set_side_of_dash_is_stdin(run_dir, env, tmp_path):
    """--src-file - and --ref-file - read stdin, as --input - does (they read a file named
    "-"); one of them at a time."""
    src, ref = tmp_path / "test.de", tmp_path / "test.en"
    src.write_text("".join(s + "\n" for s in sentences(3, seed=6)))
    ref.write_text("A man.\nA dog.\nA cat.\n")

    def run(flags: list, stdin: Path | None = None):
        with open(stdin or os.devnull) as source:
            return subprocess.run([sys.executable, "translate.py", "--model", str(run_dir),
                                   "-q", *map(str, flags)], cwd=REPO, env=env,
                                  stdin=source, capture_output=True, text=True, timeout=240)

    from_files = run(["--score", "--src-file", src, "--ref-file", ref])
    assert from_files.returncode == 0, from_files.stderr
    for flags, stdin in ((["--src-file", "-", "--ref-file", ref], src),
                         (["--src-file", src, "--ref-file", "-"], ref)):
        result = run(["--score", *flags], stdin)
        assert result.returncode == 0, result.stderr
        assert result.stdout == from_files.stdout
    result = run(["--evaluate", "--greedy", "--src-file", "-", "--ref-file", ref], src)
    assert result.returncode == 0 and result.stdout.startswith("BLEU = "), result.stderr


def test_both_sides_of_a_test_set_from_stdin_are_refused(capsys, no_model):
    status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--src-file", "-",
                                              "--ref-file", "-"], capsys)
    assert status == 2 and line == ("translate.py: error: --src-file - and --ref-file - would "
                                    "both read standard input; give one of them as a file.")


def test_a_sentence_argument_that_is_not_utf8_is_named(capsys, no_model):
    """Python decodes such argv bytes to lone surrogates, which SentencePiece cannot take."""
    status, line = _main(translate_cli.main, ["--model", "m", "ok", "Ein \udcffMann"], capsys)
    assert status == 2 and line == ("translate.py: error: sentence argument 2 is not valid "
                                    "UTF-8 (byte 0xff at character 5); give UTF-8 text, or "
                                    "use --input FILE")


def test_a_second_reference_file_is_refused_not_dropped(capsys, no_model):
    status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--src-file", "s",
                                              "--ref-file", "r1", "--ref-file", "r2"], capsys)
    assert status == 2 and line.startswith("translate.py: error: --ref-file is given twice "
                                           "(r1, r2)")


def test_a_test_file_from_stdin_is_refused(capsys, no_model):
    """Its format comes from its suffix, so "-" would be read as a file of that name."""
    status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--test-file", "-",
                                              "--src", "de", "--tgt", "en"], capsys)
    assert status == 2 and line.startswith("translate.py: error: --test-file reads a .tsv, "
                                           ".jsonl or .parquet file")
    assert "--src-file -" in line


# ----------------------------------------------------------------------------- NaN, infinity


def _float_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if "float" in str(f.type)]


@pytest.mark.parametrize("section,name", [(s, n) for s, cls in SECTIONS.items()
                                          for n in _float_fields(cls)])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_setting_refuses_nan_and_infinity(section, name, value):
    cls = SECTIONS[section]
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name} must be a finite number"):
        dataclasses.replace(cls(), **{name: value})


def test_there_are_float_settings_in_every_section_checked():
    assert {s for s, cls in SECTIONS.items() if _float_fields(cls)} == set(SECTIONS)


@pytest.mark.parametrize("flag,value", [("--alpha", "nan"), ("--max-len-a", "inf"),
                                        ("--temperature", "nan"), ("--dropout", "nan"),
                                        ("--max-minutes", "inf")])
def test_train_refuses_nan_and_infinity_at_the_declaration(flag, value, tmp_path, capsys,
                                                           monkeypatch):
    def no_training(*args):
        raise AssertionError(f"train.py accepted {flag} {value} and went on to train")

    monkeypatch.setattr(train_command, "_run", no_training)
    status, line = _main(train_cli.main, [flag, value, "--output-dir", tmp_path / "run"],
                         capsys)
    assert status == 2 and "must be a finite number" in line and f"{flag} {value}" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["--alpha", "nan"], ["--sample", "--temperature", "nan"],
                                  ["--max-len-a", "inf"], ["--max-len-a", "nan"],
                                  ["--alpha", "1e400"]])
def test_translate_refuses_nan_and_infinity_before_loading(argv, capsys, no_model):
    status, line = _main(translate_cli.main, ["--model", "m", *argv, "Hallo."], capsys)
    flag = argv[-2]
    assert status == 2 and line.startswith(f"translate.py: error: {flag} ")
    assert "must be a finite number" in line and "unexpected" not in line
    assert "SearchConfig" not in line  # the flag, not the field


@pytest.mark.parametrize("argv, message", [
    (["--input", "in.txt", "Hallo."], "give sentences as arguments or --input FILE, not both"),
    (["--plot-attention", "a.png", "Eins.", "Zwei."], "--plot-attention needs exactly one"),
    (["--model", "m2", "--plot-attention", "a.png", "Hallo."], "give one --model"),
    # Found when the plot was saved, after translating, as an unexpected ValueError.
    (["--plot-attention", "a.xyz", "Hallo."], "--plot-attention a.xyz: its suffix .xyz is no "
                                              "image format; end the name in one of"),
    (["--plot-attention", "attention", "Hallo."], "attention: it has no suffix"),
    (["--html", "--nbest", "2", "Hallo."], "--html gives one translation per input line and "
                                           "does not apply with --nbest"),
    (["--html", "--evaluate", "--test-prefix", "t"], "does not apply with --evaluate"),
    (["--html", "--no-split-sentences", "<p>Hallo.</p>"], "--no-split-sentences does not "
                                                          "apply with it"),  # was ignored
    (["--chunk-lines", "0", "Hallo."], "--chunk-lines must be >= 1, got 0"),
    (["--evaluate", "--test-prefix", "t", "Hallo."], "--evaluate reads --src-file/--ref-file"),
    (["--score", "--input", "in.txt", "--test-prefix", "t"], "--score reads"),
    (["--evaluate", "--src-file", "s.en"], "--evaluate needs both --src-file and --ref-file"),
    (["--score", "--test-prefix", "t", "--test-file", "t.tsv"], "--score needs exactly one of"),
    (["--score", "--test-prefix", "t", "--nbest", "2"], "--nbest does not apply with --score"),
    (["--report", "r.json", "Hallo."], "--report only applies with --evaluate or --score"),
    (["--test-prefix", "t", "Hallo."], "--test-prefix only applies with --evaluate or --score"),
    (["--split", "dev", "Hallo."], "--split only applies with --evaluate or --score"),
    (["--src", "", "Hallo."], "argument --src: '' is blank"),
    (["--evaluate", "--test-prefix", "t", "--split", "dev"],
     "--split names a part of a --dataset, and none is given"),
    (["--score", "--test-prefix", "t", "--dataset-config", "de-en"],
     "--dataset-config names a part of a --dataset, and none is given"),
])
def test_translate_refuses_flags_that_cannot_go_together_before_loading(argv, message, capsys,
                                                                        no_model):
    status, line = _main(translate_cli.main, ["--model", "m", *argv], capsys)
    assert status == 2 and line.startswith("translate.py: error: ") and message in line, line


@pytest.mark.parametrize("seed, message", [
    ("-1", "must be an integer from 0 to 4294967295 (2**32 - 1), got -1"),
    # Beyond a C long: this once ended in an unexpected OverflowError after the model loaded.
    ("99999999999999999999", "got 99999999999999999999"),
    ("1.5", "expected an integer, got '1.5'"),
])
def test_translate_refuses_a_seed_outside_32_bits_before_loading(seed, message, capsys,
                                                                 no_model):
    status, line = _main(translate_cli.main, ["--model", "m", "--sample", "--seed", seed,
                                              "Hallo."], capsys)
    assert status == 2 and line.startswith("translate.py: error: argument --seed: ")
    assert message in line, line


def test_the_largest_sampling_seed_samples(run_dir, capsys):
    status = translate_cli.main(["--model", str(run_dir), "--sample", "--seed", str(2**32 - 1),
                                 "-q", "Ein Mann."])
    assert status == 0 and capsys.readouterr().out.strip()


def test_a_source_language_other_than_the_models_is_refused_when_translating(run_dir, capsys):
    """--src sets the sentence splitter's rules: another language's are the user's mistake."""
    status, line = _main(translate_cli.main, ["--model", run_dir, "-q", "--src", "fr",
                                              "Ein Mann."], capsys)
    assert status == 2
    assert line.startswith("translate.py: error: --src fr, but the model translates de->en")


@pytest.mark.parametrize("mode", ["--evaluate", "--score"])
def test_a_test_set_in_another_direction_than_the_models_is_refused(mode, run_dir, tmp_path,
                                                                    capsys):
    for side in ("de", "en"):
        (tmp_path / f"test.{side}").write_text("Ein Mann.\n")
    status, line = _main(translate_cli.main, ["--model", run_dir, "-q", mode, "--test-prefix",
                                              tmp_path / "test", "--src", "en", "--tgt", "de"],
                         capsys)
    assert status == 2, line
    assert line == ("translate.py: error: --src en, but the model translates de->en (recorded "
                    "with it); give --src de, or leave --src and --tgt out to use the model's.")


@pytest.mark.parametrize("mode", ["--evaluate", "--score"])
def test_an_empty_test_set_is_one_line_before_the_model_loads(mode, tmp_path, capsys,
                                                              no_model):
    for side in ("de", "en"):
        (tmp_path / f"test.{side}").write_text("")
    status, line = _main(translate_cli.main, ["--model", "m", mode, "--test-prefix",
                                              tmp_path / "test", "--src", "de", "--tgt", "en"],
                         capsys)
    assert status == 1, line
    assert line.endswith("test.en: the test set holds no pairs; give one that has some (are "
                         "these the right files?).")


def test_a_file_given_as_dataset_is_sent_to_test_file_before_the_model_loads(tmp_path, capsys,
                                                                              no_model):
    """translate.py has no --train-file: its --dataset errors name its own flags."""
    pairs = tmp_path / "trans.jsonl"
    pairs.write_text('{"de": "a", "en": "b"}\n')
    status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--src", "de",
                                              "--tgt", "en", "--dataset", pairs], capsys)
    assert status == 1, line
    assert line.endswith(f"{pairs}: is a file, not a dataset: give a file of pairs with "
                         "--test-file, and --dataset a directory written by save_to_disk or a "
                         "hub name"), line


def test_a_missing_test_prefix_file_is_told_the_likely_slip_before_the_model_loads(
        tmp_path, capsys, no_model):
    """--test-prefix's files missing: the compressed file or the language suffix is named, as
    train.py's prefixes are."""
    (tmp_path / "test.de").write_text("a\n")
    (tmp_path / "test.en.gz").write_bytes(b"")
    for prefix, hint in ((tmp_path / "test", f"{tmp_path}/test.en.gz is gzip-compressed"),
                         (tmp_path / "test.de", f"drop the language suffix: --test-prefix "
                                                f"{tmp_path}/test")):
        status, line = _main(translate_cli.main, ["--model", "m", "--evaluate", "--src", "de",
                                                  "--tgt", "en", "--test-prefix", prefix], capsys)
        assert status == 1, line
        assert f"--test-prefix {prefix} with --src de --tgt en reads {prefix}.de and" in line
        assert hint in line, line


def test_a_stored_nan_setting_is_refused_naming_the_file(run_dir, tmp_path, capsys,
                                                         monkeypatch):
    from nmt.models.model_dir import ModelDirError, load_model

    model = tmp_path / "model"
    shutil.copytree(run_dir / "model", model)
    values = json.loads((model / "config.json").read_text())
    values["search"]["alpha"] = math.nan  # as an earlier train.py --alpha nan stored it
    (model / "config.json").write_text(json.dumps(values))
    (model / "params.msgpack").write_bytes(b"")  # refused before the parameters are read
    with pytest.raises(ModelDirError, match=r"config\.json: invalid 'search' settings .*alpha "
                                            r"must be a finite number"):
        load_model(model)
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _main(translate_cli.main, ["--model", model, "Hallo."], capsys)
    assert status == 1 and str(model / "config.json") in line and "alpha" in line


# ----------------------------------------------------------------------------- MarianMT


def test_a_marian_directory_points_to_the_converter(tmp_path, capsys, monkeypatch):
    marian = tmp_path / "opus-mt-de-en"
    marian.mkdir()
    (marian / "config.json").write_text(json.dumps({"model_type": "marian", "d_model": 512}))
    (marian / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _main(translate_cli.main, ["--model", marian, "Hallo."], capsys)
    assert status == 1
    assert f"python -m nmt.convert from-marian {marian} OUT" in line
    assert "train with train.py" not in line


def test_a_ctranslate2_export_given_to_the_jax_engine_points_to_its_engine(tmp_path, capsys,
                                                                           monkeypatch):
    export = tmp_path / "ct2"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"add_source_bos": False}))
    (export / "model.bin").write_bytes(b"")
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _main(translate_cli.main, ["--model", export, "Hallo."], capsys)
    assert status == 1
    assert f"{export} is a CTranslate2 export (model.bin)" in line
    assert "--engine ctranslate2" in line and "train with train.py" not in line


def test_a_full_disk_while_exporting_names_the_file_and_leaves_nothing(run_dir, tmp_path,
                                                                       monkeypatch):
    import errno

    from flax import nnx

    from nmt.models.model_dir import export_model, load_model

    model, tokenizer, _ = load_model(run_dir)
    write_bytes = Path.write_bytes

    def full_disk(self, data):
        if self.name == "params.msgpack":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    out = tmp_path / "exported"
    with pytest.raises(OSError) as info:
        export_model(out, nnx.state(model, nnx.Param), model.config, tokenizer)
    assert info.value.filename == str(out / "params.msgpack")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- --score


@pytest.mark.parametrize("flags", [
    # Was ignored: the search renormalises over K candidates, --score over the vocabulary.
    ["--shortlist", "20"], ["--beam", "5"], ["--alpha", "1.0"], ["--length-penalty", "power"],
    ["--beam-rules", "exact"], ["--max-len-a", "2"], ["--max-len-b", "9"], ["--min-len", "3"],
    ["--nbest", "2"], ["--greedy"], ["--sample"], ["--temperature", "0.5"], ["--top-k", "5"],
])
def test_score_refuses_search_flags_before_loading(flags, capsys, no_model):
    status, line = _main(translate_cli.main, ["--model", "m", "--score", "--test-prefix", "t",
                                              *flags], capsys)
    assert status == 2, line
    assert line.startswith(f"translate.py: error: {flags[0]} does not apply with --score, "
                           "which scores each reference over the whole vocabulary"), line


def test_score_is_the_same_whatever_search_the_model_stores(run_dir, tmp_path, capsys):
    """--score searches nothing: stored settings that no flag may override change no score."""
    (tmp_path / "s.de").write_text("Ein Mann fährt Fahrrad.\nDer Hund.\n")
    (tmp_path / "r.en").write_text("A man rides a bike.\nThe dog runs in the park.\n")
    sampling = tmp_path / "model"
    shutil.copytree(run_dir / "model", sampling)
    values = json.loads((sampling / "config.json").read_text())
    values["search"].update(strategy="sample", top_k=7, temperature=0.3, min_len=40,
                            max_len_a=0.0, max_len_b=1)
    (sampling / "config.json").write_text(json.dumps(values))
    scores = []
    for model in (run_dir, sampling):
        status = translate_cli.main(["--model", str(model), "-q", "--score", "--src-file",
                                     str(tmp_path / "s.de"), "--ref-file",
                                     str(tmp_path / "r.en")])
        scores.append(capsys.readouterr().out)
        assert status == 0
    assert scores[0] == scores[1] and len(scores[0].splitlines()) == 2


def test_a_min_len_beyond_32_bits_translates_as_one_at_the_models_positions(run_dir, capsys):
    """It once ended in an unexpected OverflowError inside the compiled search."""
    outputs = []
    for min_len in ("64", "3000000000"):  # the model's max_len, and beyond int32
        status = translate_cli.main(["--model", str(run_dir), "-q", "--min-len", min_len,
                                     "Der Hund.", "Ein Mann fährt Fahrrad."])
        outputs.append(capsys.readouterr().out)
        assert status == 0
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2


@pytest.mark.parametrize("engine", ["jax", "ctranslate2"])
def test_a_top_k_above_the_vocabulary_names_the_flag_or_the_stored_setting(engine, run_dir,
                                                                           tmp_path, capsys,
                                                                           monkeypatch):
    """Was 'top_k 301 is ...' (the field), and with ctranslate2 an unexpected ValueError."""
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))  # its conversion
    stored = tmp_path / "model"
    shutil.copytree(run_dir / "model", stored)
    values = json.loads((stored / "config.json").read_text())
    values["search"].update(strategy="sample", top_k=400)
    (stored / "config.json").write_text(json.dumps(values))
    for model, flags, named in ((run_dir, ["--sample", "--top-k", "301"], "--top-k 301"),
                                (stored, [], "the model's stored top_k 400")):
        status, line = _main(translate_cli.main, ["--model", model, "-q", "--engine", engine,
                                                  *flags, "Hallo."], capsys)
        assert status == 2, line
        assert line == (f"translate.py: error: invalid search settings for this model: {named} "
                        "is larger than the model's vocabulary (300 tokens); use a smaller "
                        "value, or 0 for no limit.")


def test_a_beam_beyond_the_memory_is_refused_by_its_flag_not_killed(run_dir, capsys,
                                                                    monkeypatch):
    """Was killed by the kernel (exit 137) after minutes: a beam's attention memory grows
    with its square."""
    from nmt.models import batch_plan
    from nmt.runtime.memory import DeviceMemory

    monkeypatch.setattr(batch_plan, "device_memory",
                        lambda: DeviceMemory("the host", 8 * 2**30, 4 * 2**30))
    status, line = _main(translate_cli.main, ["--model", run_dir, "-q", "--beam", "100000",
                                              "Hallo."], capsys)
    assert status == 2
    assert line.startswith("translate.py: error: invalid search settings for this model: "
                           "--beam 100000 needs up to ")
    assert line.endswith(" more than the 4.0 GiB free on the host; give --beam "
                         f"{line.split('give --beam ')[1].split()[0]} or less.")


def test_a_carriage_return_in_an_input_file_is_warned_of_once(tmp_path, caplog):
    """--input FILE is read twice, counted and checked first, then translated: its carriage
    returns are warned of by the first reading only."""
    from types import SimpleNamespace

    from nmt.translation import streams

    def translate_all(lines, progress=None, first_line=1, source=""):
        return SimpleNamespace(nbest=[[SimpleNamespace(text=line, score=0.0)] for line in lines],
                               reached_limit=[])

    source = tmp_path / "in.en"
    source.write_bytes(b"One.\rTwo.\nThree.\n")
    args = SimpleNamespace(nbest=None, plot_attention=None, sentences=[], input=str(source),
                           quiet=True, chunk_lines=1)
    with caplog.at_level("WARNING"):
        count = streams.count_valid_lines(str(source))
        out = io.StringIO()
        streams.translate_input(SimpleNamespace(translate_all=translate_all), args, count, out,
                                None, None)
    assert out.getvalue() == "One. Two.\nThree.\n"  # one output line per input line
    assert [r.getMessage().count("carriage return") for r in caplog.records] == [1]


def test_a_model_trained_with_cudnn_attention_translates_on_a_cpu(run_dir, tmp_path, capsys):
    """Was 'unexpected RuntimeError: cuDNN is not detected', and with --dtype float32
    'unexpected ValueError'; cuDNN's attention is the GPU's, XLA's elsewhere."""
    stored = tmp_path / "model"
    shutil.copytree(run_dir / "model", stored)
    values = json.loads((stored / "config.json").read_text())
    values["model"].update(dtype="bfloat16", attention_impl="cudnn")
    (stored / "config.json").write_text(json.dumps(values))
    for flags in ([], ["--dtype", "float32"]):
        assert translate_cli.main(["--model", str(stored), *flags, "-q", "Hallo."]) == 0
        assert capsys.readouterr().out.strip()
