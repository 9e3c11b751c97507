"""Stage 1 of the demo: a byte-level BPE tokenizer and a tiny Qwen3 AR model on a corpus."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .config import CorpusConfig, ModelShape, TokenizerConfig, TrainConfig
from .corpus import Document
from .distributed import setup
from .export import save_base_checkpoint
from .modeling import build_model, hidden_states, trunk_and_head
from .objective import ar_loss
from .packing import pack_documents
from .tokenizer import MASK_TOKEN, train_bpe_tokenizer
from .trainer import CheckpointHook, finish, train


def sample_text(docs: list[Document], max_chars: int) -> list[str]:
    out, total = [], 0
    for doc in docs:
        if total >= max_chars:
            break
        out.append(doc.prompt + doc.text)
        total += len(out[-1])
    return out


def build_tokenizer(docs: list[Document], cfg: TokenizerConfig, shape: ModelShape):
    tok = train_bpe_tokenizer(sample_text(docs, cfg.train_chars), cfg.vocab_size)
    if len(tok) > shape.vocab_size:
        raise ValueError(
            f"tokenizer has {len(tok)} tokens but the model has only {shape.vocab_size} embedding rows"
        )
    return tok


def train_base(
    train_docs: list[Document],
    tok_cfg: TokenizerConfig,
    shape: ModelShape,
    cfg: TrainConfig,
    out: Path,
    work: Path,
    checkpoint_hooks: Sequence[CheckpointHook] = (),
) -> Path:
    """Train the tokenizer and the AR model; the MASK id is reserved but never seen here."""
    dist = setup()
    if dist.world_size > 1:
        # The tiny demo base is not sharded: each rank would train (and save) its own copy.
        raise ValueError(
            f"the base stage runs in one process (got WORLD_SIZE={dist.world_size}); "
            "data-parallel training is the convert stage's (FSDP)"
        )
    tokenizer = build_tokenizer(train_docs, tok_cfg, shape)
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    data = pack_documents(tokenizer, train_docs, cfg.seq_len, cfg.max_tokens)
    if (data.input_ids == mask_id).any():
        raise ValueError(f"the corpus contains the literal MASK token {MASK_TOKEN}")
    model = build_model(shape, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.seed).to(
        dist.device
    )
    _, head = trunk_and_head(model)

    def step_fn(step, input_ids, loss_mask, clean_loss, doc_ids=None):
        loss = ar_loss(hidden_states(model, input_ids), head, input_ids, loss_mask)
        return loss, {"loss": float(loss.detach())}

    train(model, data, step_fn, cfg, work, "base", dist, checkpoint_hooks)
    save_base_checkpoint(model.cpu(), tokenizer, out)
    finish(work)
    return out


def corpus_summary(cfg: CorpusConfig, train_docs: list[Document], heldout: list[Document]) -> str:
    chars = sum(len(d.text) + len(d.prompt) for d in train_docs)
    return (
        f"corpus: {len(train_docs)} train docs ({chars / 1e6:.1f}M chars), {len(heldout)} held out"
    )
