"""Frozen, validated configs: one dataclass per concern, and the recipe that groups them.

A recipe is plain data (JSON in `training/configs/`); its hash keys the demo cache, so two
builds with the same recipe reuse each other's outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vllm_idlm.formats.adapter import TARGET_MODULES
from vllm_idlm.formats.checkpoint import FORMAT_VERSION

CONFIG_DIR = Path(__file__).parent / "configs"
# head_dim values vLLM's CPU attention backend supports.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# Field metadata. HASH_FREE: changes speed or logging, never the model (not hashed).
# ADDED: an option added after caches were built: hashed only when set away from its default,
# so adding it does not invalidate every cached build.
HASH_FREE = {"hash": False}
ADDED = {"hash": "unless_default"}


def hash_view(obj: Any) -> Any:
    """`dataclasses.asdict` for cache keys: drops HASH_FREE fields and ADDED fields at their
    default, recursively; other values pass through."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            rule = f.metadata.get("hash", True)
            if rule is False:
                continue
            if rule == "unless_default" and value == _default(f):
                continue
            out[f.name] = hash_view(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [hash_view(v) for v in obj]
    if isinstance(obj, dict):
        return {k: hash_view(v) for k, v in obj.items()}
    return obj


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


@dataclass(frozen=True)
class ModelShape:
    """A Qwen3 decoder's size; `vocab_size` is the embedding rows (may exceed the tokenizer)."""

    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        _require(
            self.head_dim in SUPPORTED_HEAD_DIMS,
            f"head_dim={self.head_dim} is not one of {SUPPORTED_HEAD_DIMS}",
        )
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}",
        )
        for name in ("vocab_size", "hidden_size", "num_layers", "intermediate_size"):
            _require(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")


@dataclass(frozen=True)
class CorpusConfig:
    """Where the text comes from. `paths` empty means the interpreter's stdlib sources."""

    paths: tuple[str, ...] = ()
    extensions: tuple[str, ...] = (".py",)
    exclude_dirs: tuple[str, ...] = ("site-packages", "test", "tests", "idle_test", "__pycache__")
    heldout_fraction: float = 0.05
    max_files: int = 0  # 0 = all
    strip_headers: bool = True
    strip_docs: bool = False  # drop comments and docstrings of .py files
    min_chars: int = 200
    split_seed: int = 0

    def __post_init__(self) -> None:
        _require(
            0.0 < self.heldout_fraction < 1.0,
            f"heldout_fraction={self.heldout_fraction} must be in (0, 1)",
        )


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 2048
    train_chars: int = 4_000_000  # BPE training sample size (chars)


@dataclass(frozen=True)
class TrainConfig:
    """One optimisation run: steps, batch, schedule, precision, logging and checkpoints."""

    steps: int = 100
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    grad_accum: int = 1
    seed: int = 0
    precision: Literal["fp32", "bf16"] = "fp32"
    log_every: int = 10
    ckpt_every: int = 200
    max_tokens: int = 0  # 0 = no cap on the packed training set size
    # Keep a copy of the trainable state every N steps in WORK/snapshots (0 = none): the
    # points of an acceptance-vs-training-time curve.
    snapshot_every: int = field(default=0, metadata=HASH_FREE)

    def __post_init__(self) -> None:
        _require(self.steps > 0, f"steps={self.steps} must be positive")
        _require(
            self.batch_size > 0 and self.grad_accum > 0,
            "batch_size and grad_accum must be positive",
        )
        _require(self.seq_len >= 2, f"seq_len={self.seq_len} must be at least 2")
        _require(self.lr > 0, f"lr={self.lr} must be positive")
        _require(
            self.precision in ("fp32", "bf16"), f"precision={self.precision!r} must be fp32 or bf16"
        )


@dataclass(frozen=True)
class ConvertConfig:
    """The AR -> I-DLM objective (ISD.md section 6)."""

    strides: tuple[int, ...] = (2, 3, 4)
    stage_fractions: tuple[float, ...] = ()  # empty = equal shares
    alpha: float = 0.2
    balance: Literal["fixed", "auto"] = "fixed"
    attention: Literal["auto", "dense", "flex"] = "auto"
    # Share of the MASK-row loss taken against the model's own clean-row distribution at the
    # same position (soft targets, teacher detached) instead of the data token; 0 = the paper's.
    distill: float = 0.0
    # Share of the training windows that are the base model's own continuations of a corpus
    # prefix (rollouts.py): they train the MASK rows only, so the drafts learn what this model
    # writes; the clean rows keep learning from the corpus. 0 = corpus only (the paper's data).
    rollouts: float = 0.0
    rollout_greedy: float = 0.5  # share of rollouts decoded greedily, the rest sampled at T = 1
    rollout_prompt: int = 32  # corpus tokens that start each rollout
    # Rollouts written by vLLM (`python -m vllm_idlm.rollouts`) instead of the in-process
    # ones: `rollouts` of the drawn windows come from this JSONL, packed whole (one answer
    # never spans two windows; answers sharing a window do not see each other).
    rollout_file: str = field(default="", metadata=ADDED)
    # Temperatures of the file's rollouts whose clean rows train too (1.0: unbiased samples
    # of the base, an AR anchor that keeps its distribution); others train MASK rows only.
    rollout_clean: tuple[float, ...] = field(default=(), metadata=ADDED)
    # Run x_0 first and only the MASK rows of x_t on top of its KV cache (no_grad when the
    # base is frozen): the same loss and gradients as the joint [x_t | x_0] forward for
    # prompt-then-response windows, with less work (two_pass.py).
    split_pass: bool = field(default=False, metadata=ADDED)

    def __post_init__(self) -> None:
        _require(len(self.strides) > 0, "strides must not be empty")
        bad = [n for n in self.strides if n < 2]
        _require(
            not bad,
            f"strides {list(self.strides)} contain {bad}: a stride must be >= 2 (stride N trains N-1 MASKs)",
        )
        if self.stage_fractions:
            _require(
                len(self.stage_fractions) == len(self.strides),
                "stage_fractions needs one entry per stride",
            )
            _require(all(f > 0 for f in self.stage_fractions), "stage_fractions must be positive")
        _require(self.alpha >= 0, f"alpha={self.alpha} must be >= 0")
        _require(0 <= self.distill <= 1, f"distill={self.distill} must be in [0, 1]")
        _require(0 <= self.rollouts <= 1, f"rollouts={self.rollouts} must be in [0, 1]")
        _require(
            0 <= self.rollout_greedy <= 1,
            f"rollout_greedy={self.rollout_greedy} must be in [0, 1]",
        )
        _require(self.rollout_prompt >= 1, f"rollout_prompt={self.rollout_prompt} must be >= 1")
        _require(
            not self.rollout_file or self.rollouts > 0,
            f"rollout_file={self.rollout_file!r} needs rollouts > 0 (the share of windows it gives)",
        )
        _require(
            all(t >= 0 for t in self.rollout_clean),
            f"rollout_clean={list(self.rollout_clean)} must hold temperatures >= 0",
        )
        _require(
            self.balance in ("fixed", "auto"), f"balance={self.balance!r} must be 'fixed' or 'auto'"
        )
        _require(
            self.attention in ("auto", "dense", "flex"),
            f"attention={self.attention!r} must be auto, dense or flex",
        )

    @property
    def block_size(self) -> int:
        """MASKs per block at the last (serving) stride."""
        return self.strides[-1] - 1

    def check_seq_len(self, seq_len: int) -> None:
        longest = max(self.strides) - 1
        _require(
            seq_len > longest,
            f"seq_len={seq_len} is shorter than a block of {longest} MASKs (+1 clean token) for stride {max(self.strides)}",
        )
        _require(
            not self.rollouts or self.rollout_prompt < seq_len,
            f"rollout_prompt={self.rollout_prompt} leaves nothing to generate in seq_len={seq_len}",
        )


@dataclass(frozen=True)
class LoraConfig:
    """The lossless mode's gated adapter (ISD.md section 4)."""

    r: int = 32
    alpha: float = 64.0
    target_modules: tuple[str, ...] = TARGET_MODULES
    train_mask_embedding: bool = True

    def __post_init__(self) -> None:
        _require(self.r > 0, f"r={self.r} must be positive")
        bad = sorted(set(self.target_modules) - set(TARGET_MODULES))
        _require(not bad, f"target_modules {bad} are not among {sorted(TARGET_MODULES)}")


@dataclass(frozen=True)
class Recipe:
    """Everything a demo build needs; `hash()` keys its cache."""

    name: str = "demo"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelShape = field(default_factory=ModelShape)
    base: TrainConfig = field(default_factory=TrainConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    convert_train: TrainConfig = field(default_factory=TrainConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    lora_train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        blob = json.dumps({"v": FORMAT_VERSION, **hash_view(self)}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


_SECTIONS = {
    "corpus": CorpusConfig,
    "tokenizer": TokenizerConfig,
    "model": ModelShape,
    "base": TrainConfig,
    "convert": ConvertConfig,
    "convert_train": TrainConfig,
    "lora": LoraConfig,
    "lora_train": TrainConfig,
}


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build a config dataclass from a dict; lists become tuples; unknown keys are errors."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    _require(not unknown, f"unknown {cls.__name__} keys: {unknown}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    unknown = sorted(set(data) - set(_SECTIONS) - {"name", "description"})
    _require(not unknown, f"unknown recipe sections: {unknown}")
    sections = {k: from_dict(cls, data.get(k, {})) for k, cls in _SECTIONS.items()}
    return Recipe(name=data.get("name", "custom"), **sections)


def load_recipe(name_or_path: str) -> Recipe:
    """A preset name from `training/configs/` (e.g. "demo", "tiny") or a JSON file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.json"
    if not path.is_file():
        presets = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
        raise ValueError(f"recipe {name_or_path!r} not found (a JSON path or one of {presets})")
    return recipe_from_dict(json.loads(path.read_text()))
