"""The README and docs/ are checked: relative links lead somewhere, every train.py,
translate.py and `python -m nmt.serving` command they show parses with today's flags, each
entry point answers --help, the README's Python example runs on a tiny model, and design.md's
layout lists every module of the tree and nothing that is not there."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import train as train_cli
import translate as translate_cli
from nmt.serving import command as serving_cli
from translate_model import make_model

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines()
            if line.startswith("#")}


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.DOTALL)


def _commands(page: Path) -> list[list[str]]:
    """Every `python train.py`, `python translate.py` or `python -m nmt.serving` command of
    the page's bash blocks, as argv after `python` (and -m), continuation lines joined,
    comments, pipes and redirections cut."""
    out = []
    for block in _blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words, skip = [], False
            for token in [*lexer, "|"]:
                if skip:
                    skip = False
                elif token in ("<", ">", ">>"):
                    skip = True  # the redirection's file
                elif token in ("|", "&&", ";", "&"):
                    while words and "=" in words[0]:  # VAR=value before the command
                        words.pop(0)
                    if len(words) >= 2 and words[0] == "python" and words[1] in (
                            "train.py", "translate.py"):
                        out.append(words[1:])
                    elif words[:3] == ["python", "-m", "nmt.serving"]:
                        out.append(words[2:])
                    words = []
                elif token != "...":  # "and the rest of the flags" in the docs
                    words.append(token)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_somewhere(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: dead link {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: no heading for #{anchor}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shown_command_parses_with_todays_flags(page):
    parsers = {"train.py": train_cli.build_parser(), "translate.py": translate_cli.build_parser(),
               "nmt.serving": serving_cli.build_parser()}
    for argv in _commands(page):
        try:
            parsers[argv[0]].parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{page.name}: `python {' '.join(argv)}` does not parse")


def test_the_readme_shows_commands():
    assert len(_commands(REPO / "README.md")) >= 10


@pytest.mark.parametrize("entry", [["train.py"], ["translate.py"], ["-m", "data.download"],
                                   ["-m", "bench.train"], ["-m", "bench.decode"],
                                   ["-m", "nmt.convert"], ["-m", "nmt.serving"]])
def test_entry_points_answer_help(entry):
    result = subprocess.run([sys.executable, *entry, "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_the_readme_python_example_runs(tmp_path):
    run_dir = make_model(tmp_path / "run")
    [example] = _blocks(REPO / "README.md", "python")
    code = example.replace('"runs/NAME"', repr(str(run_dir)))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    translations = eval(result.stdout.strip())  # the printed list of strings
    assert isinstance(translations, list) and len(translations) == 1


def _layout() -> dict[str, str]:
    """design.md's layout as {path: description}, a folder's path ending in "/": a line
    indented two spaces more than a folder's line lies inside that folder."""
    section = (REPO / "docs" / "design.md").read_text().split("\n## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", section, flags=re.DOTALL).group(1)
    listed, folders = {}, []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        name, _, description = line.strip().partition(" ")
        assert indent % 2 == 0 and indent // 2 <= len(folders), f"misplaced: {line!r}"
        del folders[indent // 2:]
        path = "".join(folders) + name
        assert path not in listed, f"listed twice: {path}"
        listed[path] = description.strip()
        if name.endswith("/"):
            folders.append(name)
    return listed


def _modules() -> set[str]:
    """Every module of transformer/, data/ and nmt/ (a package as its folder, which stands for
    its __init__.py), the scripts, and train.py's defaults."""
    files = {path.relative_to(REPO).as_posix() for package in ("transformer", "data", "nmt")
             for path in (REPO / package).rglob("*.py")}
    return ({f.removesuffix("__init__.py") for f in files}
            | {"train.py", "translate.py", "nmt/settings/defaults.yaml"})


def test_the_design_layout_lists_every_module_with_what_it_does():
    listed = _layout()
    missing = sorted(_modules() - set(listed))
    assert not missing, f"docs/design.md's layout lacks {missing}"
    undescribed = sorted(path for path, description in listed.items() if not description)
    assert not undescribed, f"docs/design.md's layout says nothing about {undescribed}"


def test_the_design_layout_lists_nothing_that_is_not_there():
    gone = sorted(path for path in _layout() if not (REPO / path).exists())
    assert not gone, f"docs/design.md's layout lists {gone}, which the tree does not hold"
