"""The benchmarks end on an ordinary mistake (a count below its least, a model or test file
that is not there) with one line naming it and exit status 2, before measuring anything: no
traceback, no figure of nothing (tokens/s 0.0, a NaN loss), no pair silently dropped."""

import importlib
import sys

import pytest

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
    "serve no test": ("serve", "--model {model} --test-prefix {missing} --src de --tgt en"),
    "serve_hostile cases": ("serve_hostile", "--model {model} --cases form-field"),
    "serve_hostile timeout 0": ("serve_hostile", "--model {model} --timeout 0"),
    "serve_hostile timeout nan": ("serve_hostile", "--model {model} --timeout nan"),
    "serve_hostile no model": ("serve_hostile", "--model {missing}"),
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
    assert line.startswith(f"{name}.py: error: ")
