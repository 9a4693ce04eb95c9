"""Recipes and command-line flags, both derived from the settings' dataclass fields.

A recipe is a YAML file with one section per dataclass of `nmt.settings.config.RunConfig`:

    model:
      preset: small        # the preset the model section's other keys change
      dropout: 0.3
    optimizer:
      schedule: inverse_sqrt
      peak_lr: 1.0e-3

Keys are the fields' names; every flag of train.py is a field's name with dashes, unless the
field names another (`--warmup` for optimizer.warmup_steps). A section's former name still
loads (`train:` for `optimizer:`, `nmt.settings.config.RENAMED_SECTIONS`), so older recipes and
run directories keep working; `dump` writes today's names. Flat JSON recipes keyed by flag
names ({"batch-tokens": 4096}) load too. A run is built from layers, later ones winning:
train.py's defaults (`nmt/settings/defaults.yaml`), the recipe, the flags; a layer that names
a split's source (`--train-file`) replaces the source earlier ones named. A recipe's strings
may name environment variables (`${MULTI30K:-data/multi30k}`, `$$` for a `$`), and a path
setting's leading `~`, in a recipe or a flag, is the home directory. Unknown sections
and keys, wrong types and invalid values are `SettingsError`s naming the file, line and key
(or flag).

This module imports no JAX: `train.py --help` is quick.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import logging
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from data.config import DEFAULT_BUCKETS, DataError, check_buckets
from nmt.runtime import cli
from nmt.settings import derived
from nmt.settings.config import RENAMED_SECTIONS, SECTIONS, Layer, RunConfig, SettingsError
from transformer.config import PRESETS, TYPE_NAMES, fits_type, get_preset

DEFAULTS_FILE = Path(__file__).with_name("defaults.yaml")
# The project's folder (where train.py and configs/ are), where a relative --config path not
# found from the current directory is looked for.
PROJECT_DIR = Path(__file__).resolve().parents[2]
RECIPES_DIR = PROJECT_DIR / "configs"  # the shipped recipes, found by name
PRESET_KEY = derived.PRESET_KEY  # in the model section: the preset its other keys change
# A run's config.yaml (`dump`) starts with this line; in a folder holding checkpoints/ (a run
# directory: nmt.rundir.checkpoints.CHECKPOINTS_DIR), that folder is the run's directory.
RUN_FILE_HEADER, RUN_FILE_NAME = "# Every setting of this run.", "config.yaml"
RUN_MARK = "checkpoints"

log = logging.getLogger("train.py")


# ----------------------------------------------------------------------------- fields


@dataclasses.dataclass(frozen=True)
class Field:
    """One setting: where it lives, its flag, its type and its help."""

    section: str
    name: str
    flag: str                    # "--warmup"
    kind: type                   # int, float, str, bool or tuple (a tuple of ints)
    choices: tuple | None        # a Literal's values
    optional: bool               # None allowed ("unset")
    help: str
    default: Any                 # the dataclass's default

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flat_name(self) -> str:
        """The flag's name with underscores: a key of flat (JSON) recipes and `from_flat`."""
        return self.flag[2:].replace("-", "_")


def _type_of(annotation: Any) -> tuple[type, tuple | None, bool]:
    """(kind, choices, optional) of a field annotation."""
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        choices = tuple(a for a in args if a is not None)
        return str, choices, optional or None in args
    if typing.get_origin(annotation) is tuple:
        return tuple, None, optional
    if annotation in (int, float, str, bool):
        return annotation, None, optional
    raise TypeError(f"unsupported setting type {annotation!r}")


def _fields_of(section: str, cls: type) -> list[Field]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "help" not in meta or meta.get("derived"):
            continue
        kind, choices, optional = _type_of(hints[f.name])
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        out.append(Field(section, f.name, flag, kind, choices, optional, meta["help"],
                         f.default))
    return out


FIELDS: list[Field] = [f for section, cls in SECTIONS.items() for f in _fields_of(section, cls)]
BY_FLAT_NAME: dict[str, Field] = {f.flat_name: f for f in FIELDS}
BY_KEY: dict[tuple[str, str], Field] = {(f.section, f.name): f for f in FIELDS}
assert len(BY_FLAT_NAME) == len(FIELDS), "two settings share a flag"

_DERIVED = {(section, f.name): f.metadata["derived"] for section, cls in SECTIONS.items()
            for f in dataclasses.fields(cls) if f.metadata.get("derived")}

# The settings that name a file or directory: a leading `~` in them is the home directory,
# in a recipe and a flag alike (the shell leaves `--output-dir=~/x` as it is).
PATH_KEYS = frozenset({
    ("tokenizer", "spm_model"), ("trainer", "output_dir"), ("trainer", "init_from"),
    *(("data", name) for name in ("train_prefix", "valid_prefix", "test_prefix", "train_file",
                                  "valid_file", "test_file", "dataset", "locale_dir"))})
assert PATH_KEYS <= set(BY_KEY), "a path key names no setting"


def _at_home(field: Field, value: Any) -> Any:
    """`value` with a leading `~` made the home directory, for a path setting."""
    if (field.section, field.name) in PATH_KEYS and isinstance(value, str):
        return os.path.expanduser(value)
    return value


# ----------------------------------------------------------------------------- layers



def _empty() -> Layer:
    return {section: {} for section in SECTIONS}


_TYPE_NAMES = {**TYPE_NAMES, tuple: "a list of integers such as [16, 32, 64], or 'default'"}


def _checked(field: Field, value: Any, where: str, takes: str = "") -> Any:
    """`value` as `field` takes it, or SettingsError naming `where` and what was expected
    (`takes` follows the type's name: " (as --batch-tokens takes)")."""
    if value is None:
        if field.optional:
            return None
        raise SettingsError(f"{where} must be {_TYPE_NAMES[field.kind]}{takes}, got null; "
                            "remove the key to use the default")
    if isinstance(value, _WrittenInt):
        value = value.text if field.kind is str else int(value)
    if field.kind is tuple:
        return _buckets(value, where)
    if field.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not fits_type(field.kind, value):  # true is not a batch size, nor "no" false
        hint = ""
        if isinstance(value, str) and field.kind in (int, float):
            try:
                field.kind(value)
                hint = f"; write {value} without quotes"
            except ValueError:
                pass
        if isinstance(value, bool) and field.kind is str:  # Norwegian's code, "no", say
            hint = ("; YAML reads a bare no, yes, off or on as false or true: put the value in "
                    "quotes ('no')")
        raise SettingsError(f"{where} must be {_TYPE_NAMES[field.kind]}{takes}, got "
                            f"{json.dumps(value, ensure_ascii=False, default=str)}{hint}")
    if field.choices is not None and value not in field.choices:
        raise SettingsError(f"{where}: {value!r} is not one of {', '.join(field.choices)}")
    if field.kind is str and not value.strip():
        raise SettingsError(f"{where} is blank; give a value, or remove the key for the default")
    return _at_home(field, value)


def _buckets(value: Any, where: str) -> tuple[int, ...]:
    """Bucket lengths from "16,32,64", [16, 32, 64] or "default"."""
    if value == "default":
        return DEFAULT_BUCKETS
    buckets: tuple = ()
    if isinstance(value, str):
        try:
            buckets = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            pass
    elif isinstance(value, (list, tuple)) and all(type(v) in (int, _WrittenInt) for v in value):
        buckets = tuple(map(int, value))
    if not buckets:
        shown = json.dumps(value, ensure_ascii=False)
        raise SettingsError(f"{where}: expected comma-separated integers such as 16,32,64, or "
                            f"'default', got {shown}")
    try:
        check_buckets(buckets)
    except DataError as err:
        raise SettingsError(f"{where}: {err}") from None
    return buckets


def from_flat(values: dict[str, Any], origin: str) -> Layer:
    """A layer from flag-style names (`batch_tokens` or `batch-tokens`, `warmup`, `preset`)."""
    layer = _empty()
    for name, value in values.items():
        flat = name.replace("-", "_")
        if flat == PRESET_KEY:
            layer["model"][PRESET_KEY] = (_preset(value, f"{origin}: preset"), origin)
            continue
        field = BY_FLAT_NAME.get(flat)
        if field is None:
            raise SettingsError(_unknown_flat_name(name, origin))
        layer[field.section][field.name] = (_checked(field, value, f"{origin}: {name!r}"),
                                            f"{origin} ({name})")
    return layer


def _unknown_flat_name(name: str, origin: str) -> str:
    """The error for a key of flag-style settings that names none: a YAML section or key
    written there is told how the flat form spells it."""
    if name in SECTIONS or name in RENAMED_SECTIONS:
        hint = (f"{name!r} is a section of a YAML recipe; here keys are train.py flag names "
                "without sections ({\"max-steps\": 100})")
    elif yaml_named := [f for f in FIELDS if f.name == name.replace("-", "_")]:
        hint = (f"{name!r} is the YAML key {yaml_named[0].key}; here write its flag name, "
                f"{yaml_named[0].flag[2:]!r}")
    else:
        hint = (f"unknown setting {name!r}{_close_match(name, [f.flag[2:] for f in FIELDS])}; "
                "keys are train.py flag names, e.g. \"batch-tokens\"")
    return f"{origin}: {hint}"


def _preset(value: Any, where: str) -> str:
    if value not in PRESETS:
        raise SettingsError(f"{where}: {value!r} is not one of {', '.join(sorted(PRESETS))}")
    return value


# ----------------------------------------------------------------------------- recipe files


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                       |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                       |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                       |[-+]?\.(?:inf|Inf|INF)
                       |\.(?:nan|NaN|NAN))$""", re.X)  # YAML 1.2's floats, `1e-9` among them
# YAML 1.2's integers (with 1.1's digit separators): `010` is 10, not 1.1's octal 8, and
# `1:30` is a string, not 1.1's base-60 90.
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$")
_NUMBER_STARTS = list("-+0123456789.")


# YAML 1.1's forms that the loader does not read: types YAML 1.2 dropped (a plain
# `2020-01-01` or `=` is a string) and 1.1's numbers, which `_INT` and `_FLOAT` replace.
_NOT_IMPLIED = {f"tag:yaml.org,2002:{name}"
                for name in ("timestamp", "value", "yaml", "int", "float")}
# The tags a recipe's value may have, written or implied: plain scalars, lists and mappings.
_PLAIN_TAGS = {f"tag:yaml.org,2002:{name}"
               for name in ("str", "int", "float", "bool", "null", "seq", "map")}


@functools.cache
def _loader():
    """YAML 1.1 with YAML 1.2's numbers: `1e-9` is a number, not the string PyYAML makes it,
    and `010` is 10. Made at first use: translate.py's flags come from this module, and need
    no YAML."""
    import yaml

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {
            first: [(tag, pattern) for tag, pattern in resolvers if tag not in _NOT_IMPLIED]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, _NUMBER_STARTS)
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, _NUMBER_STARTS)
    Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    return Loader


class _WrittenInt(int):
    """An integer written in another form than its decimal one (`08`, `0o10`, `0x1f`): a
    string setting takes it as written. config.yaml files written before YAML 1.2's numbers
    hold such strings bare (1.1 read `08` and `0o10` as strings)."""

    text: str


def _construct_int(loader, node) -> int:
    """An integer as YAML 1.2 reads it (`!!int 1:30` is a ValueError, which `_constructed`
    names): decimal, 0o octal or 0x hexadecimal."""
    written = loader.construct_scalar(node)
    text = written.replace("_", "")
    digits = text.lstrip("+-")
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    value = (-1 if text.startswith("-") else 1) * int(digits, base)
    if written == str(value):
        return value
    number = _WrittenInt(value)
    number.text = written
    return number


@functools.cache
def _dumper():
    """A dumper that knows the loader's numbers, so that it quotes a string such as "1e3" or
    "0o10" (a directory's name), which `_loader` would otherwise read back as a number."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_implicit_resolver("tag:yaml.org,2002:int", _INT, _NUMBER_STARTS)
    Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, _NUMBER_STARTS)
    return Dumper


def find_recipe(path: str | Path) -> Path:
    """Where a --config path is: as given (relative to the current directory), else, for a
    relative path, in the project's own folder (`configs/multi30k_cpu.yaml` from anywhere), and
    a bare name in its configs/, with or without .yaml (`multi30k_cpu`); SettingsError naming
    the places looked in and the shipped recipes when none holds it."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    places = [PROJECT_DIR / given]
    if len(given.parts) == 1:
        places.append(RECIPES_DIR / given)
        if given.suffix.lower() not in (".yaml", ".yml", ".json"):
            places.append(RECIPES_DIR / f"{given}.yaml")
    for place in places:
        if place.is_file():
            return place
    shipped = sorted(recipe.stem for recipe in RECIPES_DIR.glob("*.yaml"))
    listing = (f"; the recipes in {RECIPES_DIR}: {', '.join(shipped)} (--config NAME runs one)"
               if shipped else "")
    raise SettingsError(f"--config {path}: no such file in the current directory "
                        f"({Path.cwd() / given}) nor in the project's folder "
                        f"({' or '.join(str(place) for place in places)}){listing}")


def read_recipe(path: str | Path) -> Layer:
    """The settings of a recipe file (`find_recipe`): YAML with sections, or a flat JSON
    object of flags."""
    path = find_recipe(path)
    if path.is_dir():
        raise SettingsError(f"--config {path}: is a directory; give a recipe file in it (.yaml "
                            "or .json), e.g. configs/multi30k_small.yaml or a run's config.yaml")
    if not path.is_file():
        raise SettingsError(f"--config {path}: no such file")
    try:
        # utf-8-sig: a byte order mark that an editor put first is not part of the recipe.
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise SettingsError(_not_utf8(path, err)) from None
    except OSError as err:
        raise SettingsError(f"--config {path}: cannot read it ({err})") from None
    layer = _read_json(path, text) if path.suffix.lower() == ".json" else _read_yaml(path, text)
    if (path.name == RUN_FILE_NAME and text.startswith(RUN_FILE_HEADER)
            and (path.parent / RUN_MARK).is_dir()):
        # A run's own file continues the run where it lies now, whatever directory it was
        # written from or moved from (its output_dir may be relative, or null: runs/NAME).
        layer["trainer"]["output_dir"] = (str(path.parent), f"{path}: the run's folder")
    if not any(layer.values()):
        raise SettingsError(f"--config {path}: the recipe sets nothing (it is empty, or holds "
                            "only comments); write its settings in it, or drop --config to use "
                            "train.py's defaults")
    return layer


def _not_utf8(path: Path, err: UnicodeDecodeError) -> str:
    """The line and byte where a recipe stops being UTF-8: an editor shows lines, not offsets."""
    line = err.object[:err.start].count(b"\n") + 1
    return (f"{path} line {line}: byte 0x{err.object[err.start]:02x} is not UTF-8; save the "
            "recipe as UTF-8")


def _read_json(path: Path, text: str) -> Layer:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """The object, unless two of its keys name one flag (json keeps the last)."""
        seen: dict[str, str] = {}
        for key, _ in pairs:
            flat = key.replace("-", "_")
            if flat in seen:
                raise SettingsError(f"--config {path}: {seen[flat]!r} and {key!r} set one "
                                    "setting; keep one")
            seen[flat] = key
        return dict(pairs)

    try:
        values = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise SettingsError(f"--config {path}: not valid JSON ({err})") from None
    if not isinstance(values, dict):
        raise SettingsError(f"--config {path}: expected a JSON object of flag: value")
    settings = {k: v for k, v in values.items() if not k.startswith(("#", "_"))}  # comments
    layer = _empty()
    for key, value in settings.items():
        flat = key.replace("-", "_")
        if flat != PRESET_KEY and flat not in BY_FLAT_NAME:
            raise SettingsError(_unknown_flat_name(key, f"--config {path}"))
        value = _expanded(value, BY_FLAT_NAME.get(flat), f"--config {path}: {key!r}")
        if flat == PRESET_KEY:
            layer["model"][PRESET_KEY] = (_preset(value, f"--config {path}: 'preset'"),
                                          f"--config {path} ('preset')")
            continue
        field = BY_FLAT_NAME[flat]
        value = _checked(field, value, f"--config {path}: {key!r}", f" (as {field.flag} takes)")
        layer[field.section][field.name] = (value, f"--config {path} ({key!r})")
    return layer


def _read_yaml(path: Path, text: str) -> Layer:
    """The settings of a recipe, read from YAML's node tree (which knows each key's line and
    keeps repeated keys, where the plain mapping keeps the last of them)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SettingsError(f"{path}{where}: not valid YAML ({problem})") from None
    layer = _empty()
    if root is None or _is_null(root):
        return layer  # an empty file, or only comments
    if not isinstance(root, yaml.MappingNode):
        raise SettingsError(f"{path}: expected sections ({', '.join(SECTIONS)}) of key: value")
    construct = _loader()("").construct_object
    written_as: dict[str, tuple[str, int]] = {}  # section -> the name the file gives it, line
    for section_node, body_node in root.value:
        written, line = _key(section_node, f"{path} line {section_node.start_mark.line + 1}")
        section = RENAMED_SECTIONS.get(written, written)
        if section not in SECTIONS:
            setting = BY_FLAT_NAME.get(section.replace("-", "_")) or next(
                (f for f in FIELDS if f.name == section), None)
            close = (f" ({section} is a setting: write it as {setting.name} under "
                     f"{setting.section}:)" if setting else _close_match(section, SECTIONS))
            raise SettingsError(f"{path} line {line}: unknown section {section!r}{close}; "
                                f"sections are {', '.join(SECTIONS)}")
        first, first_line = written_as.setdefault(section, (written, line))
        if first_line != line:
            former = written if written != section else first
            what = (f"section {written} is given again (line {first_line})" if first == written
                    else f"sections {first} and {written} are one, {section} ({former} is its "
                         "former name)")
            raise SettingsError(f"{path} line {line}: {what}; merge them into {section}:")
        if _is_null(body_node):
            continue
        if not isinstance(body_node, yaml.MappingNode):
            raise SettingsError(f"{path} line {line}: section {written} must hold key: value "
                                "lines")
        for key_node, value_node in body_node.value:
            key, line = _key(key_node, f"{path} line {key_node.start_mark.line + 1}: {written}")
            where = f"{path} line {line}: {written}.{key}"
            if key in layer[section]:
                raise SettingsError(f"{where} is given twice; keep one")
            value = _constructed(construct, value_node, where)
            layer[section][key] = (_yaml_value(section, key, value, where), where)
    return layer


def _constructed(construct: Callable, node, where: str) -> Any:
    """The value of `node`; SettingsError for a tag other than plain YAML's (`!!set`,
    `!!python/...`) or a value its tag cannot build (`!!int abc`), which PyYAML raises as
    anything from ValueError to AttributeError."""
    import yaml

    _check_tags(node, where, ())
    try:
        return construct(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, LookupError) as err:
        problem = getattr(err, "problem", None) or f"{type(err).__name__}: {err}"
        raise SettingsError(f"{where}: YAML cannot build this value ({problem}); write a plain "
                            "value") from None


def _check_tags(node, where: str, within: tuple) -> None:
    """SettingsError for a tag in `node`'s tree that is not plain YAML's, or an alias to a
    list or mapping that holds it (`within`: the nodes around this one)."""
    import yaml

    if node.tag not in _PLAIN_TAGS:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise SettingsError(f"{where}: recipes take no YAML tag {tag}; write a plain value (a "
                            "string, number, true or false, or list)")
    if any(node is outer for outer in within):
        raise SettingsError(f"{where}: the value holds itself (an alias to its own anchor); "
                            "write the value out")
    children = (node.value if isinstance(node, yaml.SequenceNode) else
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else [])
    for child in children:
        _check_tags(child, where, (*within, node))


def _key(node, where: str) -> tuple[str, int]:
    """(a mapping key's name, its line); SettingsError for a key that is not a plain name
    (`off:` and `1e3:` are a bool and a number to YAML, `<<:` merges another mapping)."""
    import yaml

    tag = node.tag.removeprefix("tag:yaml.org,2002:")
    if not isinstance(node, yaml.ScalarNode) or tag != "str":
        kind = "a merge key" if tag == "merge" else f"read by YAML as a {tag}"
        raise SettingsError(f"{where}: the key {node.value!r} is {kind}, not a name; write "
                            "each setting out by its name")
    return node.value, node.start_mark.line + 1


def _is_null(node) -> bool:
    return node.tag == "tag:yaml.org,2002:null"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_variables(text: str, where: str) -> str:
    """`${NAME}` and `${NAME:-default}` in a recipe's string value, from the environment: a
    recipe names where its data usually lies and a user points it elsewhere without editing
    it (`MULTI30K=~/data/multi30k python train.py --config ...`). As in the shell, the
    default replaces a variable that is unset or empty, and may name variables itself. `$$`
    is one `$` (how `dump` writes a `$`), so that any text can be written; the shell's other
    forms (`$HOME`, `${A-x}`, `${A:=x}`) are refused, not taken as text. A `$` before
    neither a name nor a brace (`$5`) is text."""
    out, at = [], 0
    while (dollar := text.find("$", at)) >= 0:
        out.append(text[at:dollar])
        if text.startswith("$$", dollar):
            out.append("$")
            at = dollar + 2
        elif text.startswith("${", dollar):
            value, at = _braced_variable(text, dollar, where)
            out.append(value)
        elif name := _NAME.match(text, dollar + 1):
            raise SettingsError(f"{where}: ${name.group()} is a shell form recipes do not "
                                f"read; write ${{{name.group()}}} for the variable, or $$ for "
                                "a $ in the text")
        else:
            out.append("$")
            at = dollar + 1
    return "".join(out) + text[at:]


def _braced_variable(text: str, dollar: int, where: str) -> tuple[str, int]:
    """The value of the `${...}` at `text[dollar]`, and where the text goes on after it."""
    name = _NAME.match(text, dollar + 2)
    after = name.end() if name else dollar + 2
    close = _closing_brace(text, after)
    if close < 0:
        raise SettingsError(f"{where}: {text[dollar:]} has no closing }}; write ${{NAME}} or "
                            "${NAME:-DEFAULT}, or $$ for a $ in the text")
    if name is None or (close != after and not text.startswith(":-", after)):
        shown = text[dollar:close + 1]
        raise SettingsError(f"{where}: {shown} is a shell form recipes do not read; write "
                            "${NAME} or ${NAME:-DEFAULT} for a variable, or $$ for a $ in the "
                            "text")
    value = os.environ.get(name.group())
    if value or (value is not None and close == after):
        return value, close + 1  # as in the shell: an empty NAME takes :-'s default
    if close == after:
        raise SettingsError(f"{where}: needs the environment variable {name.group()} (or write "
                            f"${{{name.group()}:-DEFAULT}} in the recipe, or $${{{name.group()}}} "
                            "for the text itself)")
    return expand_variables(text[after + 2:close], where), close + 1


def _closing_brace(text: str, start: int) -> int:
    """The index of the `}` that closes a `${` whose inside begins at `start` (nested `${...}`
    and `$$` skipped), or -1."""
    depth, at = 0, start
    while at < len(text):
        if text.startswith("$$", at) or text.startswith("${", at):
            depth += text[at + 1] == "{"
            at += 2
        elif text[at] == "}":
            if depth == 0:
                return at
            depth -= 1
            at += 1
        else:
            at += 1
    return -1


def _expanded(value: Any, field: Field | None, where: str) -> Any:
    """`value` with its variables expanded; SettingsError for a variable in a number or a bool,
    which would read as a string (`${BT:-4096}` is "4096") and then fail as if quoted."""
    if not isinstance(value, str):
        return value
    variables = "${" in value.replace("$$", "")
    if field is not None and field.kind in (int, float, bool) and variables:
        what = "true or false" if field.kind is bool else "the number"
        raise SettingsError(f"{where}: ${{...}} is expanded in string settings only; write "
                            f"{what}")
    return expand_variables(value, where)


def _yaml_value(section: str, key: str, value: Any, where: str) -> Any:
    field = BY_KEY.get((section, key))
    value = _expanded(value, field, where)
    if section == "model" and key == PRESET_KEY:
        return _preset(value, where)
    if field is None:
        if (section, key) in _DERIVED:
            raise SettingsError(f"{where} is not a setting: it comes from "
                                f"{_DERIVED[(section, key)]}; remove it")
        names = [f.name for f in FIELDS if f.section == section]
        elsewhere = [f.key for f in FIELDS if f.name == key]
        hint = (f"; it belongs in {elsewhere[0].split('.')[0]}:" if elsewhere else
                _close_match(key, names))
        raise SettingsError(f"{where}: unknown key{hint}; {section} keys are {', '.join(names)}"
                            + (", preset" if section == "model" else ""))
    return _checked(field, value, where)


def _close_match(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def defaults() -> Layer:
    """train.py's defaults (`nmt/settings/defaults.yaml`), each of origin "default": an
    error names the user's flags and recipe lines, not these."""
    layer = _read_yaml(DEFAULTS_FILE, DEFAULTS_FILE.read_text(encoding="utf-8"))
    return {section: {key: (value, "default") for key, (value, _) in values.items()}
            for section, values in layer.items()}


# ----------------------------------------------------------------------------- building


# Keys of the data section that name one source of a split: a layer that gives one of them
# replaces the source of earlier layers (a --train-file flag beside a recipe's train_prefix).
SOURCE_KEYS = (("train_prefix", "train_file", "dataset", "builtin"),
               ("valid_prefix", "valid_file"), ("test_prefix", "test_file"))
_GOES_WITH = {"dataset": ("dataset_config",)}  # a source's key -> those that go with it


# Model settings that are the run's numerics, not the model's shape: they carry over to a
# preset that a later layer names (a recipe's dtype: bfloat16 under --preset big).
NUMERICS = ("dtype", "activation_dtype", "attention_impl")


def merge(*layers: Layer) -> Layer:
    """One layer of `layers`, later ones winning. A layer that names a preset starts the
    model from it: model keys of earlier layers but `NUMERICS` do not carry over to another
    preset, nor those of the defaults (`defaults`) to any preset named. A layer that names a
    split's source (`SOURCE_KEYS`) drops the other sources of that split that earlier layers
    named."""
    return _merged(layers)[0]


def _merged(layers: Iterable[Layer]) -> tuple[Layer, list[tuple[str, dict[str, tuple]]]]:
    """`merge`'s layer, and for each preset that replaced model keys given by an earlier
    layer (not the defaults) and not by its own: the preset's origin and those keys."""
    merged, replaced = _empty(), []
    for layer in layers:
        if PRESET_KEY in layer["model"] and _starts_the_model(layer, merged):
            model = merged["model"]
            given = {key: value for key, value in model.items()
                     if key not in (*layer["model"], *NUMERICS) and value[1] != "default"}
            if given:
                replaced.append((layer["model"][PRESET_KEY][1], given))
            merged["model"] = {key: value for key, value in model.items() if key in NUMERICS}
        for keys in SOURCE_KEYS:
            if any(layer["data"].get(key, (None,))[0] for key in keys):
                for key in keys:
                    for name in (key, *_GOES_WITH.get(key, ())):
                        merged["data"].pop(name, None)
        for section, values in layer.items():
            merged[section].update(values)
    return merged, replaced


def _warn_of_replaced_model_keys(layers: Iterable[Layer]) -> None:
    """A warning naming the model keys a preset flag replaced: they are not silently lost."""
    for preset, given in _merged(layers)[1]:
        values = ", ".join(f"{key}={value}" for key, (value, _) in given.items())
        places = _places([origin for _, origin in given.values()])
        log.warning("%s replaces the recipe's model settings %s (%s); give them as flags to "
                    "keep them", preset, values, places)


def _places(origins: list[str]) -> str:
    """"recipe.yaml lines 3, 4" for lines of one recipe (`_read_yaml`'s origins), else the
    origins as they are."""
    found = [re.fullmatch(r"(.*) line (\d+): \S+", origin) for origin in origins]
    if not all(found) or len({match.group(1) for match in found}) > 1:
        return "; ".join(origins)
    lines = ", ".join(match.group(2) for match in found)
    return f"{found[0].group(1)} line{'s' * (len(found) > 1)} {lines}"


def _starts_the_model(layer: Layer, merged: Layer) -> bool:
    """Whether `layer`'s preset replaces the model keys merged so far: unless they were
    given for the same preset (a recipe's, named again by --preset)."""
    before, origin = merged["model"].get(PRESET_KEY, (None, "default"))
    return origin == "default" or before != layer["model"][PRESET_KEY][0]


def build(*layers: Layer) -> RunConfig:
    """The RunConfig of `layers` merged (later ones win), every section validated; a
    SettingsError names where an invalid value was given."""
    merged = merge(*layers)
    model_values = dict(merged["model"])
    preset = model_values.pop(PRESET_KEY, ("small", "default"))[0]
    seed = merged["optimizer"].get("seed", (0, "default"))[0]
    sections = {}
    for section, cls in SECTIONS.items():
        values = {k: v for k, (v, _) in (model_values if section == "model"
                                         else merged[section]).items()}
        if section in ("data", "tokenizer", "batching"):
            values["seed"] = seed  # derived from optimizer.seed
        try:
            sections[section] = (get_preset(preset, **values) if section == "model"
                                 else cls(**values))
        except ValueError as err:
            raise SettingsError(_locate(str(err).rstrip("."), section, merged)) from None
    return RunConfig(preset=preset, **sections)


def _locate(message: str, section: str, merged: Layer) -> str:
    """`message` with where the values it names were given ("--dropout 1.5", a recipe line)."""
    origins = []
    for name, (_, origin) in merged[section].items():
        field = BY_KEY.get((section, name))
        names = {name} | ({field.flag, field.flat_name} if field else set())
        if origin != "default" and any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", message)
                                       for n in names):
            origins.append(origin)
    return f"{message} (given by {'; '.join(origins)})" if origins else message


# ----------------------------------------------------------------------------- flags


def add_flags(parser: argparse.ArgumentParser, defaults_layer: Layer | None = None) -> None:
    """One argument group per section, one flag per setting; a flag left out is None.

    The help shows train.py's default: `defaults_layer`'s value, else the dataclass's.
    """
    shown = merge(defaults_layer or _empty())
    for section in SECTIONS:
        group = parser.add_argument_group(f"{section} settings")
        if section == "model":
            preset = shown["model"].get(PRESET_KEY, ("small",))[0]
            group.add_argument("--preset", choices=sorted(PRESETS), default=None,
                               help=f"model size (default {preset}); the model flags below "
                                    "change it; one other than the recipe's replaces the "
                                    f"recipe's model settings but {', '.join(NUMERICS)} (a "
                                    "warning names those replaced)")
        add_section_flags(group, section, shown=shown[section],
                          default_note=_model_default(preset, shown["model"])
                          if section == "model" else None)


def _model_default(preset: str, shown: dict[str, tuple[Any, str]]) -> Callable[[Field], str]:
    """The help's default of a model flag: the preset's, but where the defaults set a value
    for a run that names no preset (`defaults`): one named, the default's own included,
    starts the model from the preset (`merge`)."""
    def note(field: Field) -> str:
        if field.name not in shown:
            return "default: the preset's"
        return (f"default {shown[field.name][0]} when neither --preset nor the recipe names a "
                f"preset, which runs {preset}; a preset named, {preset} included, gives its own")
    return note


def add_section_flags(group, section: str, exclude: Iterable[str] = (),
                      shown: dict[str, tuple[Any, str]] | None = None,
                      default_note: str | Callable[[Field], str] | None = None) -> None:
    """The flags of one section's settings (but `exclude`), each None when left out. The help
    ends with `default_note` (or its answer for the field), or else the default: `shown`'s
    value or the dataclass's."""
    for field in (f for f in FIELDS if f.section == section and f.name not in exclude):
        note = default_note(field) if callable(default_note) else default_note
        says_default = re.search(r"\(default|; default|default runs", field.help)
        text = (field.help if says_default and not note
                else f"{field.help} ({note or _default_text(field, shown or {})})")
        if field.kind is bool:
            group.add_argument(field.flag, dest=field.flat_name, default=None, help=text,
                               action=argparse.BooleanOptionalAction)
        else:
            group.add_argument(field.flag, dest=field.flat_name, default=None, help=text,
                               type=_flag_parser(field), choices=_flag_choices(field),
                               metavar=_metavar(field))


def _default_text(field: Field, shown: dict[str, tuple[Any, str]]) -> str:
    default = shown.get(field.name, (field.default, None))[0]
    if field.kind is bool:
        return f"default {'on' if default else 'off'}"
    if default is None:
        return "default: unset"
    return f"default {','.join(map(str, default)) if field.kind is tuple else default}"


def _flag_choices(field: Field) -> tuple | None:
    """A flag's values for argparse: the setting's, and `none` (UNSET) where it may be unset."""
    if field.choices is None or not field.optional:
        return field.choices
    return (*field.choices, UNSET)


def _metavar(field: Field) -> str | None:
    if field.choices is not None:
        return "{" + ",".join(map(str, _flag_choices(field))) + "}"
    return {int: "N", float: "X", tuple: "LENGTHS"}.get(field.kind)


class _Unset:
    """A flag given as "none": the setting unset, over a recipe's value (argparse's None is
    a flag left out)."""

    def __repr__(self) -> str:
        return "none"


UNSET = _Unset()


def _flag_parser(field: Field):
    """argparse's `type` for a flag: the string converted, or ArgumentTypeError."""
    def parse(text: str):
        # A path or a free string may be called "none"; a setting's named values never are.
        if (field.optional and text.lower() == "none"
                and (field.kind is not str or field.choices is not None)):
            return UNSET
        if field.kind is str:
            return _at_home(field, cli.given(text))
        if field.kind is tuple:
            try:
                return _buckets(text, field.flag)
            except SettingsError as err:
                raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None
        try:
            return field.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {_TYPE_NAMES[field.kind]}, got {text!r}") from None

    parse.__name__ = field.kind.__name__
    return parse


def from_args(args: argparse.Namespace) -> Layer:
    """The flags given on the command line (those left out are None and not in the layer);
    flags the parser does not have are skipped."""
    layer = _empty()
    if getattr(args, PRESET_KEY, None) is not None:
        layer["model"][PRESET_KEY] = (args.preset, f"--preset {args.preset}")
    for field in FIELDS:
        value = getattr(args, field.flat_name, None)
        if value is UNSET:
            layer[field.section][field.name] = (None, f"{field.flag} none")
        elif value is not None:
            shown = ",".join(map(str, value)) if field.kind is tuple else value
            layer[field.section][field.name] = (value, f"{field.flag} {shown}")
    return layer


# ----------------------------------------------------------------------------- writing


def dump(run: RunConfig) -> str:
    """The recipe of `run` as YAML: `load` of it gives `run` back. The model section holds the
    preset and the values that differ from it; every other section holds all its settings,
    but for the vocabulary size of a run with --init-from: it is the model's, derived again."""
    import yaml

    preset = PRESETS[run.preset]
    sections: dict[str, dict[str, Any]] = {}
    notes: dict[str, str] = {}
    for section in SECTIONS:
        config = getattr(run, section)
        values = {}
        if section == "model":
            values[PRESET_KEY] = run.preset
        for field in (f for f in FIELDS if f.section == section):
            value = getattr(config, field.name)
            if section == "model" and value == getattr(preset, field.name):
                continue
            if (section, field.name) == ("tokenizer", "vocab_size") and run.trainer.init_from:
                notes[section] = "  # vocab_size: the model's, as trainer.init_from gives it\n"
                continue
            values[field.name] = _written(field, value)
        sections[section] = values
    head = (f"{RUN_FILE_HEADER} `python train.py --config THIS_FILE` continues it, in the\n"
            "# folder that holds this file; add --output-dir NEW to train its settings anew.\n")
    body = "\n".join(yaml.dump({section: values}, Dumper=_dumper(), sort_keys=False,
                               allow_unicode=True, default_flow_style=None)
                     + notes.get(section, "")
                     for section, values in sections.items())
    return head + body


def _written(field: Field, value: Any) -> Any:
    """`value` as a recipe writes it, so that reading it gives `value` back: `$` as `$$`
    (`expand_variables`), and a path that `~` begins, where it is not the home directory
    (`_at_home`), as ./~."""
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, str):
        return value
    if _at_home(field, value) != value:
        value = f"./{value}"
    return value.replace("$", "$$")


def resolve(defaults_layer: Layer, *layers: Layer) -> RunConfig:
    """The RunConfig of `layers` over `defaults_layer`, with the settings that the files they
    name imply (`nmt.settings.derived`: --init-from's architecture, --spm-model's vocabulary).
    train.py's flags and `load` both build their settings here."""
    asked = merge(*layers)  # the defaults do not count
    _warn_of_replaced_model_keys(layers)
    run = build(defaults_layer, *layers, *derived.implied_layers(asked, layers))
    _check_schedule_settings(run, asked, merge(defaults_layer))
    # train.py's own warm-up suits its default run: a short run that keeps it is a test.
    if _given_own_value(asked, defaults_layer, "warmup_steps") and (
            warning := run.warmup_warning()):
        log.warning(warning)
    if run.trainer.init_from and PRESET_KEY not in asked["model"]:
        # The run is named after the preset of the model's architecture, where one has it.
        run = dataclasses.replace(
            run, preset=derived.preset_with_architecture(run.model) or run.preset)
    return run


def _given_own_value(asked: Layer, defaults_layer: Layer, key: str) -> bool:
    """Whether optimizer.`key` was given by its flag, or by a file with a value other than
    the default: a run's config.yaml lists every setting, the default ones too."""
    if key not in asked["optimizer"]:
        return False
    value, origin = asked["optimizer"][key]
    field = BY_KEY[("optimizer", key)]
    return (origin.startswith(f"{field.flag} ")
            or value != defaults_layer["optimizer"].get(key, (field.default,))[0])


# Settings that some learning-rate schedules read and the others ignore: key -> readers.
_SCHEDULE_SETTINGS = {"lr_scale": ("noam",), "peak_lr": ("inverse_sqrt", "linear"),
                      "decay_steps": ("linear",)}


def _check_schedule_settings(run: RunConfig, asked: Layer, defaults_layer: Layer) -> None:
    """SettingsError for a schedule setting given, with a value of its own, to a schedule
    that ignores it (--lr-scale with inverse_sqrt): it would silently change nothing. A
    value equal to the default passes: a run's config.yaml lists every setting."""
    schedule = run.optimizer.schedule
    for key, readers in _SCHEDULE_SETTINGS.items():
        if schedule in readers or key not in asked["optimizer"]:
            continue
        value, origin = asked["optimizer"][key]
        field = BY_KEY[("optimizer", key)]
        default = defaults_layer["optimizer"].get(key, (field.default,))[0]
        if value == default:
            continue
        # A file's value (a run's config.yaml, fitted) is undone by a flag over it.
        drop = ("drop it" if origin.startswith(f"{field.flag} ") else
                f"drop it from that file or pass {field.flag} "
                f"{'none' if field.optional else default}")
        raise SettingsError(
            f"{origin}: only --schedule {' or '.join(readers)} reads {key}, and this run's "
            f"schedule is {schedule}; {drop}, or choose a schedule that reads it.")


def load(path: str | Path) -> RunConfig:
    """The RunConfig of a recipe file over train.py's defaults, as `train.py --config` has it."""
    return resolve(defaults(), read_recipe(path))


def load_saved(path: str | Path) -> RunConfig:
    """The RunConfig of a run's own config.yaml: every setting as the run resolved it, so
    nothing is filled in from defaults or derived again from the files it names."""
    return build(read_recipe(path))


def run_from_flat(**values: Any) -> RunConfig:
    """A RunConfig from flag-style names (`preset`, `batch_tokens`, `warmup`, `beam`, ...),
    each put in its section; unnamed settings take train.py's defaults (`defaults`)."""
    return build(defaults(), from_flat(values, "from_flat"))
