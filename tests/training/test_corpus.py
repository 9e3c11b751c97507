"""Corpus reading (files, JSONL text/prompt+response/chat), cleaning, split by file, packing."""

from __future__ import annotations

import json

from idlm_training.config import CorpusConfig
from idlm_training.corpus import collect_files, load_corpus, read_documents, strip_header
from idlm_training.packing import batch_indices, pack_documents


def test_strip_header_drops_licence_block():
    text = "#!/usr/bin/env python\n# Copyright X\n# Licence Y\n\nimport os\n# keep me\n"
    assert strip_header(text) == "import os\n# keep me\n"


def test_jsonl_records_keep_prompt_clean(tmp_path, tiny_tokenizer):
    path = tmp_path / "data.jsonl"
    records = [
        {"text": "plain text " * 30},
        {"prompt": "Q: add? ", "response": "def add(a, b): return a + b " * 10},
        {
            "messages": [
                {"role": "user", "content": "hi " * 40},
                {"role": "assistant", "content": "hello " * 40},
            ]
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    cfg = CorpusConfig(paths=(str(path),), extensions=(".jsonl",), min_chars=10)
    docs = read_documents(collect_files(cfg), cfg)
    assert [bool(d.prompt) for d in docs] == [False, True, True]
    assert docs[2].prompt.endswith("<|im_start|>assistant\n") and docs[2].text.endswith(
        "<|im_end|>\n"
    )
    packed = pack_documents(tiny_tokenizer, docs[1:2], seq_len=1024)
    n_prompt = len(tiny_tokenizer(docs[1].prompt, add_special_tokens=False)["input_ids"])
    assert not packed.loss_mask[0, :n_prompt].any() and packed.loss_mask[0, n_prompt]


def test_dedup_and_split_by_file(tmp_path):
    for i in range(40):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n" * 50)
    (tmp_path / "dup.py").write_text("x = 0\n" * 50)
    train, heldout = load_corpus(CorpusConfig(paths=(str(tmp_path),), heldout_fraction=0.2))
    assert len(train) + len(heldout) == 40  # the duplicate is dropped
    assert not {d.name for d in train} & {d.name for d in heldout}


def test_batch_indices_cover_epoch_and_are_pure():
    first = [batch_indices(10, 5, s, seed=3).tolist() for s in range(2)]
    assert sorted(first[0] + first[1]) == list(range(10))
    assert batch_indices(10, 5, 1, seed=3).tolist() == first[1]


def test_strip_comments_and_docstrings_keeps_code_valid():
    import ast

    from idlm_training.python_source import strip_comments_and_docstrings

    src = '"""Module doc."""\nimport os  # why\n\n\n\n# note\ndef f(x):\n    """Doc."""\n    return x  # ret\n\n\ndef g():\n    """Only a docstring."""\n'
    out = strip_comments_and_docstrings(src)
    assert out == 'import os\n\ndef f(x):\n    return x\n\ndef g():\n    """Only a docstring."""\n'
    ast.parse(out)
