"""Corpus: find the files, read them as documents, clean and dedup them, split by file.

A document is text with an optional clean prompt: the conversion masks the response part only.
Sources are directories (searched by extension), glob patterns, plain text/code files, and
JSONL files whose records carry `text`, or `prompt`/`response`, or chat `messages`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config import CorpusConfig
from .python_source import strip_comments_and_docstrings


@dataclass(frozen=True)
class Document:
    name: str
    text: str
    prompt: str = ""  # kept clean (never masked, no loss); `text` is the response


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def collect_files(cfg: CorpusConfig) -> list[Path]:
    """Resolve `cfg.paths` (or the stdlib) into a sorted file list; raise on unknown or empty."""
    roots = list(cfg.paths) or [str(stdlib_dir())]
    files: set[Path] = set()
    for root in roots:
        found = _expand(root, cfg)
        if not found:
            raise ValueError(
                f"corpus path {root!r} matched no files (extensions {list(cfg.extensions)} for directories)"
            )
        files.update(found)
    out = sorted(files)
    if cfg.max_files:
        out = out[: cfg.max_files]
    return out


def _expand(root: str, cfg: CorpusConfig) -> list[Path]:
    path = Path(root).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        excluded = set(cfg.exclude_dirs)
        return [
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix in cfg.extensions
            and not excluded.intersection(p.relative_to(path).parts[:-1])
        ]
    if any(ch in root for ch in "*?["):
        return [Path(p) for p in glob.glob(root, recursive=True) if Path(p).is_file()]
    raise ValueError(f"corpus path {root!r} does not exist")


def read_documents(files: Iterable[Path], cfg: CorpusConfig) -> list[Document]:
    """Read, clean and dedup (by content hash) the documents of all files, in file order."""
    seen: set[str] = set()
    docs: list[Document] = []
    for path in files:
        for doc in _read_file(path, cfg):
            key = hashlib.sha1((doc.prompt + "\0" + doc.text).encode()).hexdigest()
            if key in seen or len(doc.prompt) + len(doc.text) < cfg.min_chars:
                continue
            seen.add(key)
            docs.append(doc)
    if not docs:
        raise ValueError(
            f"corpus is empty after reading {len(list(files))} files (min_chars={cfg.min_chars})"
        )
    return docs


def _read_file(path: Path, cfg: CorpusConfig) -> list[Document]:
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    if path.suffix == ".jsonl":
        return [
            doc
            for i, line in enumerate(raw.splitlines())
            if line.strip()
            for doc in [_record(path, i, line)]
        ]
    text = strip_header(raw) if cfg.strip_headers else raw
    if cfg.strip_docs and path.suffix == ".py":
        text = strip_comments_and_docstrings(text)
    return [Document(name=str(path), text=text)]


def _record(path: Path, index: int, line: str) -> Document:
    rec = json.loads(line)
    name = f"{path}:{index}"
    if "text" in rec:
        return Document(name, rec["text"])
    if "prompt" in rec and "response" in rec:
        return Document(name, rec["response"], prompt=rec["prompt"])
    if "messages" in rec:
        msgs = rec["messages"]
        last = msgs[-1]
        if last.get("role") != "assistant":
            raise ValueError(f"{name}: the last chat message must be the assistant's response")
        prompt = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs[:-1])
        return Document(
            name, f"{last['content']}<|im_end|>\n", prompt=prompt + "<|im_start|>assistant\n"
        )
    raise ValueError(f"{name}: a JSONL record needs 'text', 'prompt'+'response', or 'messages'")


def strip_header(text: str) -> str:
    """Drop a leading licence/comment header (shebang, coding line, `#` block) and blank lines.

    Licence boilerplate is the same in many files; it teaches memorisation, not code.
    """
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        i += 1
    return "".join(lines[i:])


def split_documents(
    docs: list[Document], cfg: CorpusConfig
) -> tuple[list[Document], list[Document]]:
    """Split by document name hash: held-out files are never trained on, stable across runs."""

    def bucket(doc: Document) -> float:
        digest = hashlib.sha1(
            f"{cfg.split_seed}:{Path(doc.name).name}:{doc.name}".encode()
        ).hexdigest()
        return int(digest[:8], 16) / 0xFFFFFFFF

    train = [d for d in docs if bucket(d) >= cfg.heldout_fraction]
    heldout = [d for d in docs if bucket(d) < cfg.heldout_fraction]
    if not train or not heldout:
        raise ValueError(
            f"corpus of {len(docs)} documents is too small to split with heldout_fraction={cfg.heldout_fraction}"
        )
    return train, heldout


def load_corpus(cfg: CorpusConfig) -> tuple[list[Document], list[Document]]:
    """(train, held-out) documents for a corpus config."""
    return split_documents(read_documents(collect_files(cfg), cfg), cfg)
