"""The docs site: every public name is in the API reference, every page is in the nav, and every
file and module the pages name exists (a module that moves must take its mentions along)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

import edgesplit

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]


def _nav_pages(entries: list) -> list[str]:
    """Every page file named in mkdocs.yml's nav, sections walked."""
    pages: list[str] = []
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, list):
                pages += _nav_pages(value)
            elif isinstance(value, str) and value.endswith(".md"):
                pages.append(value)
    return pages


def test_the_api_reference_lists_every_public_name():
    text = (DOCS / "api.md").read_text()
    listed = re.findall(r"^::: edgesplit\.(\w+)\s*$", text, flags=re.M)
    missing = [name for name in edgesplit.__all__ if name not in listed]
    assert not missing, f"docs/api.md lacks ::: edgesplit.NAME for {missing}"
    unknown = [name for name in listed if name not in edgesplit.__all__]
    assert not unknown, f"docs/api.md documents names outside edgesplit.__all__: {unknown}"


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == pages, f"nav {sorted(nav)} against docs/ {pages}"


def test_docs_python_examples_compile():
    for page in DOCS.rglob("*.md"):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            compile(block, str(page), "exec")


def test_the_files_the_docs_name_exist():
    path = re.compile(
        r"(?<![\w./-])((?:edgesplit|tests|benchmarks|scripts|devices|profiles|apps)/[\w./-]*\w)"
    )
    missing = [
        f"{page.name}: {name}"
        for page in PAGES
        for name in path.findall(page.read_text())
        if not name.startswith("edgesplit/_data") and not (ROOT / name).exists()
    ]
    assert not missing, missing


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_the_modules_and_names_the_docs_name_exist():
    dotted = re.compile(r"(?<![\w./-])(edgesplit(?:\.[a-z_]\w*)+)")
    missing = [
        f"{page.name}: {name}"
        for page in PAGES
        for name in set(dotted.findall(page.read_text()))
        if not _resolves(name)
    ]
    assert not missing, missing
