"""Recipes and flags, derived from the settings' dataclass fields: round trips, the legacy
JSON form, and bad input named by file, line and key."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from nmt.settings import recipes
from nmt.settings.config import SECTIONS, SettingsError

REPO = Path(__file__).resolve().parents[1]


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_every_setting_is_a_flag_and_a_recipe_key():
    """One declaration per setting: each non-derived field has a flag and a recipe key."""
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    for section, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):
            derived = field.metadata.get("derived")
            known = (section, field.name) in recipes.BY_KEY
            assert known != bool(derived), (section, field.name)
            if known:
                assert recipes.BY_KEY[(section, field.name)].flag in flags


def test_flags_keep_their_names_and_map_to_sections():
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    args = parser.parse_args(["--warmup", "30", "--accum", "2", "--beam", "6",
                              "--max-tokens-per-sentence", "40", "--tokenizer-type", "bpe",
                              "--no-share-embeddings", "--buckets", "8,16", "--preset", "tiny"])
    run = recipes.build(recipes.defaults(), recipes.from_args(args))
    assert (run.optimizer.warmup_steps, run.optimizer.accum_steps, run.search.beam_size) == (
        30, 2, 6)
    assert (run.batching.max_len, run.batching.buckets) == (40, (8, 16))
    assert run.tokenizer.model_type == "bpe" and run.model.share_embeddings is False
    assert run.preset == "tiny" and run.model.d_model == 24


def test_the_help_says_when_the_defaults_model_settings_apply(tmp_path):
    """defaults.yaml's dropout is for a run that names no preset; naming one, the default
    preset included, starts the model from the preset, and --help says so."""
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser, recipes.defaults())
    dropout = next(a for a in parser._actions if "--dropout" in a.option_strings)
    assert dropout.help.endswith("(default 0.0 when neither --preset nor the recipe names a "
                                 "preset, which runs compact; a preset named, compact included, "
                                 "gives its own)")
    compact = recipes.PRESETS["compact"]
    assert compact.dropout != 0.0
    named = recipes.from_args(parser.parse_args(["--preset", "compact"]))
    in_recipe = recipes.read_recipe(_recipe(tmp_path, "model:\n  preset: compact\n"))
    assert recipes.build(recipes.defaults()).model == dataclasses.replace(compact, dropout=0.0)
    assert recipes.build(recipes.defaults(), named).model == compact
    assert recipes.build(recipes.defaults(), in_recipe).model == compact


def test_a_flag_given_as_none_unsets_what_the_recipe_sets(tmp_path):
    recipe = recipes.read_recipe(_recipe(tmp_path, "optimizer:\n  clip_norm: 1.0\n"
                                                   "trainer:\n  max_steps: 500\n"))
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    flags = recipes.from_args(parser.parse_args(["--clip-norm", "none", "--max-steps", "None"]))
    run = recipes.build(recipes.defaults(), recipe, flags)
    assert (run.optimizer.clip_norm, run.trainer.max_steps) == (None, None)
    assert flags["trainer"]["max_steps"] == (None, "--max-steps none")
    left_out = recipes.from_args(parser.parse_args([]))
    assert recipes.build(recipes.defaults(), recipe, left_out).optimizer.clip_norm == 1.0


def test_a_setting_of_named_values_given_as_none_unsets_what_the_recipe_sets(tmp_path):
    recipe = recipes.read_recipe(_recipe(tmp_path, "model:\n  attention_impl: cudnn\n"
                                                   "trainer:\n  written_for: gpu\n"
                                                   "  best_metric: chrf\n"))
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    flags = recipes.from_args(parser.parse_args(
        ["--attention-impl", "none", "--written-for", "None", "--best-metric", "NONE"]))
    run = recipes.build(recipes.defaults(), recipe, flags)
    assert (run.model.attention_impl, run.trainer.written_for, run.trainer.best_metric) == (
        None, None, None)
    assert flags["trainer"]["written_for"] == (None, "--written-for none")
    with pytest.raises(SystemExit):
        parser.parse_args(["--written-for", "nowhere"])
    # a setting that takes any text keeps "none" as text: sacreBLEU has a tokenizer of that name
    assert parser.parse_args(["--bleu-tokenize", "none"]).bleu_tokenize == "none"


def test_yaml_round_trip(tmp_path):
    # Strings YAML 1.2 would read as numbers ("1e3", a directory's name) come back as strings.
    run = recipes.run_from_flat(preset="tiny", dropout=0.25, clip_norm=1.0, buckets=(8, 16),
                              train_prefix="2.5e3/train", output_dir="1e3", valid_prefix=".5",
                              max_minutes=3, best_metric="chrf", peak_lr=1e-4)
    path = _recipe(tmp_path, recipes.dump(run))
    loaded = recipes.load_saved(path)
    assert loaded == run
    assert recipes.dump(loaded) == path.read_text()


def test_a_dump_reads_back_as_the_same_run_whatever_its_text(tmp_path, monkeypatch):
    """A flag's `$`, `${X}` and `~` are the text given (the shell has expanded what it
    would): the run's config.yaml writes them so that they read back as given, where a
    recipe's `${X}` is a variable and `~` the home directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("X", raising=False)
    run = recipes.run_from_flat(source="cost ${X} here, $5, $$ and ~", output_dir="runs/${HOME}x",
                                train_prefix="$HOME/${X:-y}/train",
                                test_prefix="~no-such-user-here/test")
    path = _recipe(tmp_path, recipes.dump(run))
    assert recipes.load_saved(path) == run
    assert recipes.load(path) == run
    assert recipes.dump(recipes.load_saved(path)) == path.read_text()
    # A path that `~` begins, built without the settings' expansion, keeps its meaning: ./~
    odd = run.replace(trainer={"output_dir": "~/x"})
    back = recipes.load_saved(_recipe(tmp_path, recipes.dump(odd)))
    assert back.trainer.output_dir == "./~/x"


def test_a_path_flag_and_a_recipe_path_read_a_leading_tilde_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    # `--output-dir=~/x`: the shell expands no `~` after `=`.
    flags = recipes.from_args(parser.parse_args(["--output-dir=~/x", "--train-file=~/p.tsv",
                                                 "--source", "~/notes"]))
    run = recipes.build(recipes.defaults(), flags)
    assert (run.trainer.output_dir, run.data.train_file) == (str(tmp_path / "x"),
                                                             str(tmp_path / "p.tsv"))
    assert run.data.source == "~/notes"  # text, not a path
    recipe = recipes.read_recipe(_recipe(tmp_path, "trainer:\n  output_dir: ~/x\ndata:\n"
                                                   "  train_file: ~/p.tsv\n  source: ~/notes\n"))
    assert recipes.build(recipes.defaults(), recipe) == run


def test_a_recipe_writes_a_dollar_sign_as_two(tmp_path, monkeypatch):
    monkeypatch.delenv("X", raising=False)
    layer = recipes.read_recipe(_recipe(tmp_path, "data:\n  source: 'costs $$5 ($${X}), $3'\n"))
    assert layer["data"]["source"][0] == "costs $5 (${X}), $3"
    with pytest.raises(SettingsError, match=r"recipe.yaml line 2: data.source: needs the "
                                            r"environment variable X \(or write \$\{X:-DEFAULT\} "
                                            r"in the recipe, or \$\$\{X\} for the text itself\)$"):
        recipes.read_recipe(_recipe(tmp_path, "data:\n  source: costs ${X}\n"))


def test_a_default_may_name_variables_as_in_the_shell(tmp_path, monkeypatch):
    monkeypatch.delenv("X", raising=False)
    monkeypatch.setenv("DATA", "/corpora")
    monkeypatch.delenv("Y", raising=False)
    text = ("data:\n  train_prefix: ${X:-${DATA}/train}\n  valid_prefix: ${X:-${Y:-v}}\n"
            "  test_prefix: ${X:-${Y:-${DATA}/test}}$$\n")
    layer = recipes.read_recipe(_recipe(tmp_path, text))
    assert [layer["data"][key][0] for key in ("train_prefix", "valid_prefix", "test_prefix")] == [
        "/corpora/train", "v", "/corpora/test$"]
    monkeypatch.setenv("X", "/mine")
    assert recipes.read_recipe(_recipe(tmp_path, text))["data"]["train_prefix"][0] == "/mine"
    with pytest.raises(SettingsError, match=r"line 2: data.train_prefix: \$\{X:-\$\{Y\}/train has "
                                            r"no closing \}; write \$\{NAME\} or"):
        recipes.read_recipe(_recipe(tmp_path, "data:\n  train_prefix: ${X:-${Y}/train\n"))


@pytest.mark.parametrize("value, form, hint", [
    ("${X-/data}/train", r"\$\{X-/data\}", r"\$\{NAME\} or \$\{NAME:-DEFAULT\} for a variable"),
    ("${X:=/data}/train", r"\$\{X:=/data\}", r"\$\{NAME\} or \$\{NAME:-DEFAULT\} for a variable"),
    ("$HOME/data/train", r"\$HOME", r"\$\{HOME\} for the variable"),
    ("${X:-$HOME}/train", r"\$HOME", r"\$\{HOME\} for the variable")])
def test_a_shell_form_recipes_do_not_read_is_refused_not_taken_as_text(tmp_path, monkeypatch,
                                                                         value, form, hint):
    monkeypatch.delenv("X", raising=False)
    with pytest.raises(SettingsError, match=rf"recipe.yaml line 2: data.train_prefix: {form} is "
                                            rf"a shell form recipes do not read; write {hint}, "
                                            r"or \$\$ for a \$ in the text$"):
        recipes.read_recipe(_recipe(tmp_path, f"data:\n  train_prefix: '{value}'\n"))


@pytest.mark.parametrize("text, message", [
    ('{"trainer": {"max_steps": 5}}', r"'trainer' is a section of a YAML recipe; here keys are "
                                      r"train.py flag names without sections"),
    ('{"warmup_steps": 5}', r"'warmup_steps' is the YAML key optimizer.warmup_steps; here write "
                            r"its flag name, 'warmup'$"),
    ('{"max-stesp": 5}', r"unknown setting 'max-stesp' \(did you mean 'max-steps'\?\); keys "
                         r"are train.py flag names")])
def test_a_json_recipe_written_as_yaml_is_told_its_flag_names(tmp_path, text, message):
    path = tmp_path / "recipe.json"
    path.write_text(text)
    with pytest.raises(SettingsError, match=rf"^--config {re.escape(str(path))}: {message}"):
        recipes.read_recipe(path)


@pytest.mark.parametrize("text", ['{"max-steps": 5, "max_steps": 7}',
                                  '{"max_steps": 5, "max_steps": 7}'])
def test_a_json_recipe_setting_one_flag_twice_is_refused(tmp_path, text):
    path = tmp_path / "recipe.json"
    path.write_text(text)
    with pytest.raises(SettingsError, match=r"recipe.json: 'max.steps' and 'max_steps' set one "
                                            r"setting; keep one"):
        recipes.load(path)


def test_legacy_json_recipe_and_its_yaml_twin_are_the_same_run(monkeypatch):
    monkeypatch.delenv("MULTI30K", raising=False)
    legacy = recipes.build(recipes.defaults(),
                           recipes.read_recipe(REPO / "tests/data/legacy_multi30k_small.json"))
    twin = recipes.load(REPO / "configs/multi30k_small.yaml")
    assert twin.data.source, "the YAML recipe says where its corpus comes from"
    # JSON recipes predate data.source and trainer.written_for, notes rather than settings
    assert legacy == dataclasses.replace(
        twin, data=dataclasses.replace(twin.data, source=None),
        trainer=dataclasses.replace(twin.trainer, written_for=None))


def test_the_former_train_section_loads_as_optimizer(tmp_path):
    """Recipes and run directories written before the section was named `optimizer` call it
    `train`: they load as before (a resumed run reads its config.yaml), and `dump` writes
    today's name."""
    from nmt.rundir import resume

    run = recipes.run_from_flat(preset="tiny", warmup=30, peak_lr=5e-4, seed=3, accum=2)
    today = recipes.dump(run)
    assert "optimizer" in yaml.safe_load(today) and "train" not in yaml.safe_load(today)
    written_then = today.replace("\noptimizer:", "\ntrain:")
    assert "train" in yaml.safe_load(written_then)
    (tmp_path / resume.RUN_CONFIG_FILE).write_text(written_then)
    assert resume.saved_run(tmp_path) == run
    old = recipes.load(_recipe(tmp_path, "train:\n  warmup_steps: 30\n  seed: 3\n"))
    assert old == recipes.load(_recipe(tmp_path, "optimizer:\n  warmup_steps: 30\n  seed: 3\n"))
    assert (old.optimizer.warmup_steps, old.batching.seed) == (30, 3)
    with pytest.raises(SettingsError, match=r"recipe.yaml line 3: sections train and optimizer "
                                            r"are one, optimizer \(train is its former name\); "
                                            r"merge them into optimizer:"):
        recipes.load(_recipe(tmp_path, "train:\n  seed: 1\noptimizer:\n  warmup_steps: 4\n"))


def test_seeds_follow_the_optimizer_seed():
    run = recipes.run_from_flat(seed=7)
    assert (run.data.seed, run.tokenizer.seed, run.batching.seed) == (7, 7, 7)


@pytest.mark.parametrize("text, message", [
    ("model:\n  preset: tiny\n  dropuot: 0.1\n",
     r"recipe.yaml line 3: model.dropuot: unknown key \(did you mean 'dropout'\?\)"),
    ("modle:\n  dropout: 0.1\n",
     r"recipe.yaml line 1: unknown section 'modle' \(did you mean 'model'\?\); sections are "
     r"model, tokenizer, data"),
    ("warmup: 100\n", r"recipe.yaml line 1: unknown section 'warmup' \(warmup is a setting: "
                       r"write it as warmup_steps under optimizer:\); sections are model"),
    ("optimizer:\n  warmup_steps: '400'\n",
     r"recipe.yaml line 2: optimizer.warmup_steps must be an integer, got \"400\"; write 400 "
     "without quotes"),
    ("model:\n  norm: middle\n", r"line 2: model.norm: 'middle' is not one of post, pre"),
    ("data:\n  src: no\n", r"line 2: data.src must be a string, got false; YAML reads a bare "
                            r"no, yes, off or on as false or true: put the value in quotes"),
    ("trainer:\n  max_minutes: [1, 2]\n", r"line 2: trainer.max_minutes must be a number"),
    ("model:\n  vocab_size: 300\n",
     r"line 2: model.vocab_size is not a setting: it comes from the tokenizer"),
    ("optimizer:\n  batch_tokens: 100\n", r"line 2: optimizer.batch_tokens: unknown key; it "
                                          r"belongs in batching:"),
    ("optimizer:\n  seed: 1\n  seed: 2\n", r"line 3: optimizer.seed is given twice"),
    # YAML keeps the last of a repeated key: the node tree, read here, keeps both.
    ("trainer:\n  max_steps: 5\ntrainer:\n  eval_every: 3\n",
     r"line 3: section trainer is given again \(line 1\); merge them into trainer:"),
    ("trainer:\n  max_steps: 5\n  off: 3\n",
     r"line 3: trainer: the key 'off' is read by YAML as a bool, not a name"),
    ("trainer:\n  1e3: 3\n", r"line 2: trainer: the key '1e3' is read by YAML as a float"),
    ("trainer:\n  max_steps: 5\n  <<: {eval_every: 3}\n",
     r"line 3: trainer: the key '<<' is a merge key, not a name"),
    ("trainer:\n  max_steps: 5\nmodel:\n", None),  # an empty section sets nothing
    ("optimizer:\n  warmup_steps: 4\n   peak_lr: 1\n",
     r"recipe.yaml line 3 column \d+: not valid YAML"),
    ("- a\n- b\n", r"recipe.yaml: expected sections"),
    ("model:\n  dropout: 1.5\n", r"ModelConfig.dropout must be in \[0, 1\), got 1.5 \(given by "
                                 r"\S*recipe.yaml line 2: model.dropout\)"),
    ("model:\n  preset: huge\n", r"line 2: model.preset: 'huge' is not one of base, big"),
    # A blank path would read as one left out: the built-in corpus, a new tokenizer.
    ("data:\n  train_prefix: ''\n", r"line 2: data.train_prefix is blank; give a value, or "
                                     r"remove the key"),
    ("trainer:\n  init_from: ' '\n", r"line 2: trainer.init_from is blank"),
])
def test_bad_recipes_name_file_line_and_key(tmp_path, text, message):
    if message is None:
        assert recipes.load(_recipe(tmp_path, text)) == recipes.load(
            _recipe(tmp_path, "trainer:\n  max_steps: 5\n"))
        return
    with pytest.raises(SettingsError, match=message):
        recipes.load(_recipe(tmp_path, text))


def test_yaml_reads_scientific_numbers_as_numbers(tmp_path):
    run = recipes.load(_recipe(tmp_path, "optimizer:\n  adam_eps: 1e-9\n  peak_lr: 5e-4\n"))
    assert (run.optimizer.adam_eps, run.optimizer.peak_lr) == (1e-9, 5e-4)


@pytest.mark.parametrize("flags, message", [
    (["--dropout", "1.5"], r"dropout must be in \[0, 1\), got 1.5 \(given by --dropout 1.5\)"),
    # SentencePiece's sampler takes an unsigned 32-bit seed: these once ended in a TypeError.
    (["--seed", "-1"], r"seed must be an integer from 0 to 4294967295 \(2\*\*32 - 1\), got -1 "
                       r"\(given by --seed -1\)"),
    (["--seed", str(2**32)], r"seed must be an integer from 0 to 4294967295 .*, got 4294967296"),
    # Refused here, not once the tokenizer is trained and the corpus encoded.
    (["--batch-tokens", "0"], r"^--batch-tokens must be >= 1, got 0 \(given by --batch-tokens "
                              r"0\)$"),
    (["--batch-tokens", "-1", "--no-packing"], r"^--batch-tokens must be >= 1, got -1 "),
])
def test_an_invalid_flag_value_names_the_flag(flags, message):
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    args = parser.parse_args(flags)
    with pytest.raises(SettingsError, match=message):
        recipes.build(recipes.defaults(), recipes.from_args(args))


def test_the_largest_seed_is_accepted():
    assert recipes.run_from_flat(seed=2**32 - 1).tokenizer.seed == 2**32 - 1


@pytest.mark.parametrize("data, line", [(b"data:\n  src: \xe9n\n", 2),
                                        (b"\xef\xbb\xbfmodel:\n  preset: small\n  # caf\xe9\n", 3)])
def test_a_recipe_that_is_not_utf8_is_named_by_line_and_byte(tmp_path, data, line):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(data)
    with pytest.raises(SettingsError, match=rf"recipe.yaml line {line}: byte 0xe9 is not UTF-8; "
                                            "save the recipe as UTF-8$"):
        recipes.read_recipe(path)


@pytest.mark.parametrize("text, what", [("batching:\n  batch_tokens: ${BT:-4096}\n", "the number"),
                                        ("optimizer:\n  peak_lr: ${LR}\n", "the number"),
                                        ("batching:\n  packing: ${PACK:-true}\n", "true or false")])
def test_a_variable_in_a_number_or_bool_setting_is_refused_as_such(tmp_path, monkeypatch, text,
                                                                    what):
    monkeypatch.setenv("LR", "1e-3")
    with pytest.raises(SettingsError, match=r"recipe.yaml line 2: \w+\.\w+: \$\{\.\.\.\} is "
                                            rf"expanded in string settings only; write {what}$"):
        recipes.read_recipe(_recipe(tmp_path, text))


@pytest.mark.parametrize("text, message", [
    ("model:\n  dropout: !foo 0.2\n", r"line 2: model.dropout: recipes take no YAML tag !foo; "),
    ("model:\n  dropout: !!python/object:os.system x\n",
     r"line 2: model.dropout: recipes take no YAML tag !!python/object:os.system; "),
    ("batching:\n  buckets: !!set {16, 32}\n", r"line 2: batching.buckets: recipes take no YAML "
                                               r"tag !!set; write a plain value"),
    ("data:\n  src: !!timestamp 'abc'\n", r"line 2: data.src: recipes take no YAML tag "
                                          r"!!timestamp"),
    ("batching:\n  buckets: [16, !!binary AAAA]\n", r"line 2: batching.buckets: recipes take no "
                                                     r"YAML tag !!binary"),
    ("model:\n  d_model: !!int abc\n", r"line 2: model.d_model: YAML cannot build this value "
                                       r"\(ValueError: .*'abc'\); write a plain value$"),
    ("model:\n  share_embeddings: !!bool abc\n", r"line 2: model.share_embeddings: YAML cannot "
                                                 r"build this value \(KeyError: 'abc'\)"),
    ("batching:\n  buckets: !!seq abc\n", r"line 2: batching.buckets: YAML cannot build this "
                                          r"value \(expected a sequence node"),
    ("batching:\n  buckets: &b [16, *b]\n", r"line 2: batching.buckets: the value holds itself"),
])
def test_yaml_tags_and_values_yaml_cannot_build_name_the_line(tmp_path, text, message):
    with pytest.raises(SettingsError, match=r"recipe.yaml " + message):
        recipes.read_recipe(_recipe(tmp_path, text))


def test_plain_tags_dates_and_anchors_still_read(tmp_path):
    layer = recipes.read_recipe(_recipe(tmp_path, "data:\n  src: !!str 2020\n  tgt: 2020-01-01\n"
                                                  "model:\n  dropout: &d 0.2\n"
                                                  "  attention_dropout: *d\n"))
    assert (layer["data"]["src"][0], layer["data"]["tgt"][0]) == ("2020", "2020-01-01")
    assert layer["model"]["attention_dropout"][0] == 0.2


def test_yaml_reads_integers_as_yaml_1_2_does(tmp_path):
    layer = recipes.read_recipe(_recipe(tmp_path, "trainer:\n  eval_every: 010\n  log_every: 0o10\n"
                                                  "  save_every: 0x10\n  keep_last: 1_0\n"))
    assert {key: value for key, (value, _) in layer["trainer"].items()} == {
        "eval_every": 10, "log_every": 8, "save_every": 16, "keep_last": 10}
    # YAML 1.1's base 60 is a string, which an integer setting refuses.
    with pytest.raises(SettingsError, match=r"line 2: trainer.max_steps must be an integer, got "
                                            r"\"1:30\"$"):
        recipes.read_recipe(_recipe(tmp_path, "trainer:\n  max_steps: 1:30\n"))
    # And a string that reads as a number is written in quotes.
    run = recipes.run_from_flat(output_dir="0o10", max_steps=5)
    assert "output_dir: '0o10'" in recipes.dump(run)


def test_a_string_setting_written_bare_as_a_number_keeps_its_text(tmp_path):
    """config.yaml files written before YAML 1.2's numbers hold `08` or `0o10` bare (1.1
    read them as strings): they still load as the names they are, and integer settings
    get plain ints that dump as numbers."""
    layer = recipes.read_recipe(_recipe(tmp_path, "data:\n  valid_prefix: 08\n"
                                                  "trainer:\n  output_dir: 0o10\n"
                                                  "  eval_every: 0x10\n"
                                                  "batching:\n  buckets: [0x10, 32]\n"))
    assert layer["data"]["valid_prefix"][0] == "08"
    assert layer["trainer"]["output_dir"][0] == "0o10"
    eval_every = layer["trainer"]["eval_every"][0]
    assert eval_every == 16 and type(eval_every) is int
    assert layer["batching"]["buckets"][0] == (16, 32)


@pytest.mark.parametrize("text, undo", [
    ("  schedule: linear\n  warmup_steps: 1\n  decay_steps: 3\n", ["--decay-steps", "none"]),
    ("  schedule: noam\n  lr_scale: 0.5\n", ["--lr-scale", "0.4"]),
])
def test_a_schedule_setting_of_a_file_left_unread_by_a_flag_names_the_flag_that_undoes_it(
        tmp_path, text, undo):
    recipe = recipes.read_recipe(_recipe(tmp_path, "optimizer:\n" + text))
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    flags = ["--schedule", "inverse_sqrt"]
    with pytest.raises(SettingsError, match=f"drop it from that file or pass {' '.join(undo)}, "):
        recipes.resolve(recipes.defaults(), recipe, recipes.from_args(parser.parse_args(flags)))
    undone = recipes.from_args(parser.parse_args(flags + undo))
    assert recipes.resolve(recipes.defaults(), recipe, undone).optimizer.schedule == "inverse_sqrt"


def test_a_run_config_yaml_warns_of_a_long_warm_up_only_as_its_flags_would(tmp_path, caplog):
    # Its config.yaml lists the default warm-up too: that is not a warm-up asked for.
    parser = argparse.ArgumentParser()
    recipes.add_flags(parser)
    flags = recipes.from_args(parser.parse_args(["--max-steps", "100"]))
    by_flags = recipes.resolve(recipes.defaults(), flags)
    saved = recipes.read_recipe(_recipe(tmp_path, recipes.dump(by_flags)))
    assert recipes.resolve(recipes.defaults(), saved) == by_flags
    assert "--warmup" not in caplog.text
    longer = recipes.from_args(parser.parse_args(["--max-steps", "100", "--warmup", "500"]))
    saved = recipes.read_recipe(_recipe(tmp_path, recipes.dump(
        recipes.resolve(recipes.defaults(), longer))))
    recipes.resolve(recipes.defaults(), saved)
    assert "--warmup 500 is not below --max-steps 100" in caplog.text
