"""Instruction prompts from Python sources: kinds, determinism, a split disjoint by module and text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idlm_training.chat_recipe import InstructionConfig
from idlm_training.instructions import (
    build_instructions,
    chat_prompt_ids,
    heldout_chat_prompts,
    write_jsonl,
)

MODULE = '''
def area(width, height):
    """Return the area of a rectangle.

    More text that is not the summary.
    """
    return width * height


class Stack:
    """A last-in first-out container."""

    def push(self, item):
        """Put ITEM on top."""
        self.items.append(item)

    def _private(self):
        """Never asked about."""
'''


@pytest.fixture()
def source_root(tmp_path: Path) -> Path:
    """40 small modules (plus a package and an excluded test dir) with the same shapes."""
    for i in range(40):
        (tmp_path / f"mod{i}.py").write_text(
            MODULE.replace("area", f"area{i}").replace("items", f"items{i}")
        )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(MODULE.replace("area", "pkg_area"))
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_x.py").write_text(MODULE.replace("area", "never_seen"))
    return tmp_path


def _cfg(root: Path, **kw) -> InstructionConfig:
    return InstructionConfig(root=str(root), **{"train": 40, "heldout": 10, **kw})


def test_requests_name_the_definition_and_quote_its_summary(source_root):
    train, heldout = build_instructions(_cfg(source_root, heldout_fraction=0.3))
    items = train + heldout
    names = {"Stack", "push", "pkg_area"} | {f"area{k}" for k in range(40)}
    assert {i.source.split(".")[-1] for i in items} <= names
    assert not any("never_seen" in i.content or i.source.endswith("_private") for i in items)
    write = [i for i in items if i.kind == "write_function" and "area" in i.source]
    assert write and all(
        "(width, height)`. What it should do: Return the area" in i.content
        and i.content.endswith("of a rectangle.")
        for i in write
    )
    methods = [i for i in items if i.kind == "write_function" and i.source.endswith("push")]
    assert all("method `Stack.push(item)`" in i.content for i in methods)
    # A function's code is shown without its docstring (a class keeps its methods' ones).
    shown = [i for i in items if "```python" in i.content and not i.source.endswith("Stack")]
    assert shown and not any('"""' in i.content for i in shown)
    assert all(i.messages == [{"role": "user", "content": i.content}] for i in items)


def test_split_is_disjoint_by_module_and_text_and_deterministic(source_root):
    cfg = _cfg(source_root, heldout_fraction=0.3)
    train, heldout = build_instructions(cfg)
    assert (train, heldout) == build_instructions(cfg)
    assert len(train) == 40 and len(heldout) == 10
    assert not {i.module for i in train} & {i.module for i in heldout}
    assert not {i.content for i in train} & {i.content for i in heldout}
    other = build_instructions(_cfg(source_root, heldout_fraction=0.3, seed=1))
    assert [i.content for i in other[0]] != [i.content for i in train]


def test_heldout_prefix_spreads_over_modules(source_root):
    _, heldout = build_instructions(_cfg(source_root, heldout_fraction=0.3))
    first = heldout[: len({i.module for i in heldout})]
    assert len({i.module for i in first}) == len(first)


def test_too_few_definitions_is_an_error_naming_the_counts(source_root):
    with pytest.raises(ValueError, match="fewer than the 5000"):
        build_instructions(_cfg(source_root, train=5000))


def test_stdlib_gives_thousands_of_disjoint_prompts():
    """The default source (this interpreter's stdlib): 3000 train / 200 held-out prompts."""
    train, heldout = build_instructions(InstructionConfig())
    assert len(train) == 3000 and len(heldout) == 200
    assert not {i.module for i in train} & {i.module for i in heldout}
    assert len({i.kind for i in heldout}) >= 6
    assert heldout_chat_prompts(3) == [i.messages for i in heldout[:3]]


def test_chat_prompt_ids_end_ready_for_the_answer(tiny_tokenizer, tmp_path, source_root):
    _, heldout = build_instructions(_cfg(source_root, heldout_fraction=0.3))
    ids = chat_prompt_ids(tiny_tokenizer, [heldout[0].messages])[0]
    text = tiny_tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    path = write_jsonl(heldout, tmp_path / "p.jsonl")
    assert [json.loads(line)["messages"] for line in path.read_text().splitlines()] == [
        i.messages for i in heldout
    ]
