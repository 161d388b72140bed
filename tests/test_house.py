"""The house rules that code review would otherwise have to catch: no public function with more
than 8 parameters (a typed options object instead), and keyword forms that match their dataclass."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import edgesplit

PACKAGE = Path(edgesplit.__file__).resolve().parent
MAX_PARAMS = 8


def _public_functions(tree: ast.Module):
    """(name, node) of every public function: module level, or a method of a public class."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith(
            "_"
        ):
            yield node.name, node
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for sub in node.body:
                if isinstance(
                    sub, ast.FunctionDef | ast.AsyncFunctionDef
                ) and not sub.name.startswith("_"):
                    yield f"{node.name}.{sub.name}", sub


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_public_function_takes_more_than_eight_parameters():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, fn in _public_functions(ast.parse(path.read_text())):
            if _count(fn) > MAX_PARAMS:
                over.append(f"{path.relative_to(PACKAGE.parent)}:{fn.lineno} {name} ({_count(fn)})")
    assert not over, (
        "public functions over 8 parameters (take a typed options object):\n" + "\n".join(over)
    )


def test_the_count_sees_keyword_only_and_star_parameters():
    fn = ast.parse("def f(a, /, b, *args, c, d=1, **kw): pass").body[0]
    assert _count(fn) == 6


def test_choice_keywords_are_the_choices_fields():
    from edgesplit.workflows.deploy import DeployOptions
    from edgesplit.workflows.resolve import ChoiceFields, Choices

    fields = {f.name for f in dataclasses.fields(Choices)}
    assert set(ChoiceFields.__optional_keys__) == fields
    assert fields <= DeployOptions.__optional_keys__
