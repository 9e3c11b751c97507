"""Instruction-style chat prompts built from the CPython standard library's own sources.

Every public function and class with a docstring becomes one user request, in one of a few
kinds chosen by a seeded draw: write it from its docstring's summary, explain / document /
type-annotate / test / review its code, or say what `module.name` does. The prompts are what
the self-rollouts answer (the base writes the responses) and what the benchmarks ask.

The split is by stdlib module (top-level package or file): a held-out module contributes no
training prompt, and no prompt text appears in both sets. Deterministic for a config on a
given interpreter (the stdlib differs between Python versions, so do the prompts).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chat_recipe import InstructionConfig

EXCLUDED_DIRS = ("site-packages", "test", "tests", "idle_test", "__pycache__")
CODE_KINDS = ("explain", "docstring", "type_hints", "tests", "review")


@dataclass(frozen=True)
class Instruction:
    """One user request: where it came from, its kind, and the chat messages."""

    source: str  # dotted module path + qualified name, e.g. "json.decoder.JSONDecoder.decode"
    module: str  # the top-level stdlib module the split is keyed by
    kind: str
    content: str

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.content}]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "module": self.module,
            "kind": self.kind,
            "messages": self.messages,
        }


@dataclass(frozen=True)
class _Definition:
    module: str
    dotted: str  # module path inside the stdlib, e.g. "email.utils"
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    code: str  # the definition's source, dedented, docstring removed


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _source_files(root: Path) -> list[Path]:
    excluded = set(EXCLUDED_DIRS)
    return sorted(
        p for p in root.rglob("*.py") if not excluded.intersection(p.relative_to(root).parts[:-1])
    )


def _summary(doc: str) -> str:
    """The docstring's first sentence, on one line."""
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines())
    sentence = re.split(r"(?<=[.!?])\s", text)[0].strip()
    return sentence.rstrip(".") + "."


def _code_without_docstring(node, lines: list[str]) -> str:
    """The definition's source lines (decorators included), minus its docstring, dedented."""
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    doc = node.body[0]
    if doc.lineno <= node.lineno:  # `def f(): "doc"`: no body lines of its own
        return ""
    keep = [
        (number, lines[number - 1])
        for number in range(start, (node.end_lineno or node.lineno) + 1)
        if not doc.lineno <= number <= (doc.end_lineno or doc.lineno)
    ]
    return textwrap.dedent("\n".join(line for _, line in keep)).strip("\n")


def _definitions(path: Path, root: Path, cfg: InstructionConfig) -> list[_Definition]:
    rel = path.relative_to(root)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts:
        return []
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        lines = source.splitlines()
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found: list[_Definition] = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if child.name.startswith("_"):
                continue
            qualname = f"{prefix}{child.name}"
            if ast.get_docstring(child):
                code = _code_without_docstring(child, lines)
                n_lines = code.count("\n") + 1
                if code and n_lines <= cfg.max_code_lines and len(code) <= cfg.max_code_chars:
                    found.append(_Definition(parts[0], ".".join(parts), qualname, child, code))
                elif isinstance(child, ast.ClassDef) or n_lines > cfg.max_code_lines:
                    # too long to show: still usable for the kinds that show no code
                    found.append(_Definition(parts[0], ".".join(parts), qualname, child, ""))
            if isinstance(child, ast.ClassDef):
                visit(child, qualname + ".")

    visit(tree, "")
    return found


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(node.args)
    args = re.sub(r"^self(, )?|^cls(, )?", "", args)
    return f"{node.name}({args})"


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _kinds(d: _Definition) -> list[str]:
    """The request kinds that make sense for a definition."""
    is_class = isinstance(d.node, ast.ClassDef)
    kinds = ["what_does"]
    kinds.append("write_class" if is_class else "write_function")
    if d.code and not is_class:
        kinds += ["explain", "docstring", "tests", "review"]
        if not d.node.returns and not any(a.annotation for a in d.node.args.args):
            kinds.append("type_hints")
    elif d.code:
        kinds.append("explain")
    return kinds


def _request(d: _Definition, kind: str) -> str:
    doc = _summary(ast.get_docstring(d.node) or "")
    name = f"{d.dotted}.{d.qualname}"
    if kind == "write_function":
        owner = d.qualname.rpartition(".")[0]
        what = (
            f"method `{owner}.{_signature(d.node)}`"
            if owner
            else f"function `{_signature(d.node)}`"
        )
        return f"Write a Python {what}. What it should do: {doc}"
    if kind == "write_class":
        return f"Write a Python class `{d.node.name}`. What it is for: {doc} Show a short usage example."
    if kind == "what_does":
        what = "class" if isinstance(d.node, ast.ClassDef) else "function"
        return f"What does the `{name}` {what} in Python's standard library do? Give an example."
    requests = {
        "explain": "Explain what this Python code does:",
        "docstring": "Write a docstring for this Python function:",
        "tests": "Write unit tests with `unittest` for this function:",
        "review": "Review this Python function and suggest improvements:",
        "type_hints": "Add type hints to this Python function:",
    }
    return f"{requests[kind]}\n\n{_fence(d.code)}"


def _is_heldout(module: str, cfg: InstructionConfig) -> bool:
    digest = hashlib.sha1(f"{cfg.split_seed}:{module}".encode()).hexdigest()
    return int(digest[:8], 16) / 0xFFFFFFFF < cfg.heldout_fraction


def build_instructions(cfg: InstructionConfig) -> tuple[list[Instruction], list[Instruction]]:
    """(train, held-out) instructions: disjoint by module and by text, seeded, deterministic."""
    root = Path(cfg.root).expanduser() if cfg.root else stdlib_root()
    if not root.is_dir():
        raise ValueError(f"instruction source {str(root)!r} is not a directory")
    rng = random.Random(cfg.seed)
    train: list[Instruction] = []
    heldout: list[Instruction] = []
    for path in _source_files(root):
        for d in _definitions(path, root, cfg):
            kind = rng.choice(_kinds(d))
            item = Instruction(f"{d.dotted}.{d.qualname}", d.module, kind, _request(d, kind))
            (heldout if _is_heldout(d.module, cfg) else train).append(item)
    heldout = _interleave_modules(_dedup(heldout, set()), rng)
    train = _dedup(train, {i.content for i in heldout})
    rng.shuffle(train)
    if len(heldout) < cfg.heldout or len(train) < cfg.train:
        raise ValueError(
            f"{root} gives {len(train)} train / {len(heldout)} held-out instructions, "
            f"fewer than the {cfg.train} / {cfg.heldout} asked for"
        )
    return train[: cfg.train], heldout[: cfg.heldout]


def _interleave_modules(items: list[Instruction], rng: random.Random) -> list[Instruction]:
    """Shuffled, then round-robin over modules: any prefix of the held-out set spreads over
    all held-out modules instead of following the largest one (email has most definitions)."""
    by_module: dict[str, list[Instruction]] = {}
    for item in items:
        by_module.setdefault(item.module, []).append(item)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by_module.items())]
    out = []
    while any(queues):
        out += [q.pop() for q in queues if q]
    return out


def _dedup(items: list[Instruction], taken: set[str]) -> list[Instruction]:
    out = []
    for item in items:
        if item.content not in taken:
            taken.add(item.content)
            out.append(item)
    return out


def heldout_chat_prompts(
    count: int | None = None, cfg: InstructionConfig | None = None
) -> list[list[dict[str, str]]]:
    """The held-out chat prompts (lists of messages) for benchmarks and evaluation."""
    _, heldout = build_instructions(cfg or InstructionConfig())
    return [i.messages for i in heldout[:count]]


def chat_prompt_ids(tokenizer, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    """Token ids of each conversation under the tokenizer's chat template, ready for the
    assistant's reply (the form vLLM's `LLM.chat` and the OpenAI server give the model)."""
    out = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def write_jsonl(items: list[Instruction], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(i.to_json()) + "\n" for i in items))
    tmp.rename(path)
    return path
