"""The benchmarks end on an ordinary mistake (a count below its least, a model or test file
that is not there) with one line naming it and exit status 2, before measuring anything: no
traceback, no figure of nothing (tokens/s 0.0, a NaN loss), no pair silently dropped."""

import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPTS = {
    "linen steps 0": ("linen_baseline", "--preset small --vocab 300 --batch 2 --src-len 4 "
                                        "--tgt-len 4 --steps 0"),
    "linen batch 0": ("linen_baseline", "--preset small --vocab 300 --batch 0 --src-len 4 "
                                        "--tgt-len 4 --steps 1"),
    "linen vocab 3": ("linen_baseline", "--preset small --vocab 3 --batch 2 --src-len 4 "
                                        "--tgt-len 4 --steps 1"),
    "startup repeats 0": ("startup", "--model {model} --repeats 0"),
    "startup no model": ("startup", "--model {missing} --only nmt-serve"),
    "alignment lines 0": ("alignment", "--model {model} --source {test}.en --lines 0"),
    "alignment no model": ("alignment", "--model {missing} --source {test}.en"),
    "alignment no source": ("alignment", "--model {model} --source {missing}.en"),
    "search_rules no model": ("search_rules", "--model {missing} --test-prefix {test} "
                                              "--src de --tgt en"),
    "search_rules no test": ("search_rules", "--model {model} --test-prefix {missing} "
                                             "--src de --tgt en"),
    "profile no test": ("translate_profile", "--model {model} --test-prefix {missing} "
                                             "--src de --tgt en"),
    "exported limit -1": ("exported", "--model {model} --test-prefix {test} --src de "
                                      "--tgt en --limit -1"),
    "exported no model": ("exported", "--model {missing} --test-prefix {test} --src de "
                                      "--tgt en"),
    **{f"exported {flag} 0": ("exported", "--model {model} --test-prefix {test} --src de "
                                          f"--tgt en --{flag} 0")
       for flag in ("beam", "inter-threads", "threads", "repeats", "searches",
                    "batch-sentences")},
    **{f"frontier {flag} 0": ("frontier", "--model m={model} --test-prefix {test} --src de "
                                          f"--tgt en --{flag} 0")
       for flag in ("passes", "beam", "inter-threads", "threads", "batch-sentences")},
    "frontier limit -1": ("frontier", "--model m={model} --test-prefix {test} --src de "
                                      "--tgt en --limit -1"),
    "frontier no model": ("frontier", "--model m={missing} --test-prefix {test} --src de "
                                      "--tgt en"),
    "serve clients 0": ("serve", "--model {model} --test-prefix {test} --src de --tgt en "
                                 "--clients 1,0"),
    "serve clients abc": ("serve", "--model {model} --test-prefix {test} --src de --tgt en "
                                   "--clients abc"),
    "serve clients -2": ("serve", "--model {model} --test-prefix {test} --src de --tgt en "
                                  "--clients -2"),
    "serve server-args quote": ("serve", "--model {model} --test-prefix {test} --src de "
                                         "--tgt en --server-args=--buckets='16"),
    "serve no test": ("serve", "--model {model} --test-prefix {missing} --src de --tgt en"),
    "serve_hostile cases": ("serve_hostile", "--model {model} --cases form-field"),
    "serve_hostile timeout 0": ("serve_hostile", "--model {model} --timeout 0"),
    "serve_hostile timeout nan": ("serve_hostile", "--model {model} --timeout nan"),
    "serve_hostile no model": ("serve_hostile", "--model {missing}"),
    "train vocab 3": ("train", "--preset tiny --vocab 3 --batch 2 --src-len 4 --tgt-len 4 "
                               "--steps 1"),
    "train heads 0": ("train", "--preset tiny --heads 0 --vocab 64 --batch 2 --src-len 4 "
                               "--tgt-len 4 --steps 1"),
    "train d-model 10 heads 3": ("train", "--preset tiny --d-model 10 --heads 3 --vocab 64 "
                                          "--batch 2 --src-len 4 --tgt-len 4 --steps 1"),
    "train batch 0": ("train", "--preset tiny --batch 0"),
    "pipeline batch-tokens 0": ("pipeline", "--batch-tokens 0"),
    "pipeline max-batches 0": ("pipeline", "--max-batches 0"),
}


@pytest.mark.parametrize("case", SCRIPTS)
def test_a_mistake_is_one_line_and_exit_status_2(case, run_dir, tmp_path, monkeypatch, capsys):
    name, flags = SCRIPTS[case]
    for lang in ("de", "en"):
        (tmp_path / f"test.{lang}").write_text("Ein Mann.\nZwei Hunde.\n", encoding="utf-8")
    flags = flags.format(model=run_dir, test=tmp_path / "test", missing=tmp_path / "missing")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *flags.split()])
    with pytest.raises(SystemExit) as refused:
        importlib.import_module(f"bench.{name}").main()
    out, err = capsys.readouterr()
    assert refused.value.code == 2, (out, err)
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"python -m bench.{name}: error: ")  # as it is run
    assert "--help" not in line or line.endswith(f"; see python -m bench.{name} --help")


SCORED = {"frontier": "--model m={model} --dtypes float32 --compute-types --passes 1",
          "exported": "--model {model} --dtypes float32 --compute-types float32",
          "search_rules": "--model {model}"}


def _refused_before_measuring(name, flags, monkeypatch, capsys) -> str:
    """The one line `name` ends with, given `flags`; loading a model to measure fails the
    test (a test set or BLEU tokenizer that cannot be used must not wait for the passes)."""
    from nmt.models import model_dir

    def measured(*args, **kwargs):
        raise AssertionError(f"{name} loaded a model to measure before refusing")

    monkeypatch.setattr(model_dir, "load_model", measured)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *flags.split()])
    with pytest.raises(SystemExit) as refused:
        importlib.import_module(f"bench.{name}").main()
    out, err = capsys.readouterr()
    assert (refused.value.code, out) == (2, ""), err
    [line] = err.splitlines()
    assert line.startswith(f"python -m bench.{name}: error: ")  # as it is run
    return line


@pytest.mark.parametrize("name, limit", [*((name, "") for name in SCORED),
                                         ("frontier", " --limit 1"), ("exported", " --limit 1")])
def test_a_test_set_whose_files_differ_in_length_is_refused_naming_both(name, limit, run_dir,
                                                                         tmp_path, monkeypatch,
                                                                         capsys):
    """Also where --limit cuts both files to the same length."""
    (tmp_path / "fr.de").write_text("Ein Mann.\nDie Katze.\nZwei Kinder.\n", encoding="utf-8")
    (tmp_path / "fr.en").write_text("A man.\nThe cat.\n", encoding="utf-8")
    flags = (SCORED[name].format(model=run_dir) + limit
             + f" --test-prefix {tmp_path / 'fr'} --src de --tgt en")
    line = _refused_before_measuring(name, flags, monkeypatch, capsys)
    assert line.endswith(f"{tmp_path / 'fr.de'} has 3 lines but {tmp_path / 'fr.en'} has 2; "
                         "give a source and a reference file of one line per pair"), line


@pytest.mark.parametrize("name", SCORED)
def test_a_bleu_tokenizer_that_cannot_run_is_refused_before_measuring(name, run_dir, tmp_path,
                                                                      monkeypatch, capsys):
    """--tgt ja scores BLEU on MeCab's words: without MeCab the command ends at once."""
    mecab = pytest.importorskip("sacrebleu.tokenizers.tokenizer_ja_mecab")
    monkeypatch.setattr(mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    for lang, text in (("de", "Ein Mann.\n"), ("ja", "男性。\n")):
        (tmp_path / f"test.{lang}").write_text(text, encoding="utf-8")
    flags = (SCORED[name].format(model=run_dir)
             + f" --test-prefix {tmp_path / 'test'} --src de --tgt ja")
    line = _refused_before_measuring(name, flags, monkeypatch, capsys)
    assert "BLEU tokenizer ja-mecab (sacreBLEU's choice for target language 'ja') needs " \
           "MeCab" in line, line
    assert "--bleu-tokenize char" in line, line


@pytest.mark.parametrize("name", SCORED)
def test_a_bleu_tokenizer_given_is_checked_before_measuring(name, run_dir, tmp_path,
                                                            monkeypatch, capsys):
    for lang in ("de", "en"):
        (tmp_path / f"test.{lang}").write_text("Ein Mann.\n", encoding="utf-8")
    flags = (SCORED[name].format(model=run_dir) + " --bleu-tokenize nonsense"
             + f" --test-prefix {tmp_path / 'test'} --src de --tgt en")
    line = _refused_before_measuring(name, flags, monkeypatch, capsys)
    assert "--bleu-tokenize: unknown BLEU tokenizer 'nonsense'" in line, line


@pytest.fixture
def pairs(tmp_path, monkeypatch) -> str:
    """200 made-up pairs (PREFIX.en, PREFIX.de), encoded into a cache of the test's own."""
    from synthetic_corpus import write_corpus

    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path, 200, 0, "train")


def _layouts(monkeypatch, *flags: str) -> None:
    monkeypatch.setattr(sys, "argv", ["layouts.py", *flags])
    importlib.import_module("bench.layouts").main()


def test_layouts_refuses_a_warmup_that_leaves_no_batch_to_time(pairs, monkeypatch, capsys):
    with pytest.raises(SystemExit) as refused:
        _layouts(monkeypatch, "--prefix", pairs, "--preset", "tiny", "--vocab", "320",
                 "--batch-tokens", "512", "--max-len", "48", "--steps", "1", "--warmup",
                 "1000")
    out, err = capsys.readouterr()
    assert (refused.value.code, out) == (2, "")
    # The corpus was encoded first (its progress and, where logging is set up, its log
    # lines), then the one line, with no traceback.
    *_, line = [text for text in err.splitlines() if text.strip()]
    assert "Traceback" not in err, err
    assert line.startswith("python -m bench.layouts: error: --warmup 1000 leaves no batch to "
                           f"time: an epoch of {pairs} holds "), line
    assert line.endswith("bucketed batches of --batch-tokens 512; give a smaller --warmup or "
                         "--batch-tokens, or more pairs"), line


class _SlowStep:
    """A train step that takes `seconds` a call and computes nothing: what the benchmark
    divides by is then known."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def lower(self, state, batch):
        return self

    def compile(self):
        return self

    def __call__(self, state, batch):
        import jax.numpy as jnp

        time.sleep(self.seconds)
        return state, {"loss": jnp.zeros(())}


def test_layouts_times_the_batches_the_epoch_holds_when_fewer_than_steps(pairs, monkeypatch,
                                                                          capsys):
    """--steps 1000 of an epoch of a few batches: step_s is the time of each batch timed,
    not the time of them all over 1000. With 3 devices every batch splits evenly over them,
    as the trainer's do."""
    from types import SimpleNamespace

    from bench import layouts

    step, rows = _SlowStep(0.02), set()

    def shard_batch(arrays, mesh):
        rows.add(len(arrays["src"]))
        return arrays

    monkeypatch.setattr(layouts.jax, "device_count", lambda: 3)
    monkeypatch.setattr(layouts, "training", SimpleNamespace(
        make_mesh=lambda: None, OptimizerConfig=lambda **_: None,
        create_train_state=lambda *_: (None, None, 0),
        make_train_step=lambda *_: step, shard_batch=shard_batch))
    _layouts(monkeypatch, "--prefix", pairs, "--preset", "tiny", "--vocab", "320",
             "--batch-tokens", "512", "--max-len", "48", "--steps", "1000", "--warmup", "1")
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["layout"] for r in records] == ["bucketed", "packed"]
    for record in records:
        assert 1 <= record["steps"] < 1000, record
        assert step.seconds <= record["step_s"] < 10 * step.seconds, record
    assert rows and all(count % 3 == 0 for count in rows), rows


def test_train_refuses_a_batch_the_devices_cannot_share(env):
    """--batch 3 on two devices: each device takes an equal share of the rows."""
    from conftest import xla_flags

    done = subprocess.run(
        [sys.executable, "-m", "bench.train", "--preset", "tiny", "--vocab", "64", "--batch",
         "3", "--src-len", "8", "--tgt-len", "8", "--steps", "2", "--warmup", "1"],
        cwd=ROOT, env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(2)},
        capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "python -m bench.train: error: --batch 3 is not a multiple of the 2 devices here; give "
        "a multiple of 2; see python -m bench.train --help"]
