"""Python source clean-up for the demo corpus: drop comments and docstrings.

A model of a few million parameters predicts code far better than English prose; the demo
trains (and evaluates, on held-out files cleaned the same way) on code only.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                doc = body[0]
                if len(body) == 1:  # keep the block valid: a lone docstring stays
                    continue
                lines.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return lines


def _comment_cuts(text: str) -> dict[int, int]:
    """line -> column where a comment starts."""
    cuts: dict[int, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                cuts[tok.start[0]] = tok.start[1]
    except (tokenize.TokenError, SyntaxError):
        pass  # an untokenizable tail: keep the comments found before it
    return cuts


def strip_comments_and_docstrings(text: str) -> str:
    """Remove docstrings (when a block keeps another statement), comments, and extra blank lines."""
    try:
        drop = _docstring_lines(ast.parse(text))
    except (SyntaxError, ValueError):
        drop = set()
    cuts = _comment_cuts(text)
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in drop:
            continue
        if number in cuts:
            line = line[: cuts[number]].rstrip()
            if not line:
                continue
        out.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n") + "\n"
