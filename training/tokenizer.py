"""Tokenizers: train the demo's byte-level BPE, and give any tokenizer a MASK token.

The MASK (`<|mask|>`) is a special token whose id is recorded in the checkpoint. For a user
checkpoint we reuse a spare row of a padded embedding matrix when there is one (Qwen3 keeps
151669 free inside its 151936 rows), and only otherwise grow the matrix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vllm_idlm.formats.checkpoint import MASK_TOKEN

EOS_TOKEN = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END, MASK_TOKEN)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE (GPT-2 style pre-tokenizer) with our special tokens, as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 16:
        raise ValueError(
            f"tokenizer vocab_size={vocab_size} is too small for 256 bytes + special tokens"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END, MASK_TOKEN],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1 << 20
    return fast


@dataclass(frozen=True)
class MaskPlan:
    """Where the MASK lives: its id, and the embedding size the model needs (resize if larger)."""

    mask_token_id: int
    new_vocab_size: int
    added: bool


def ensure_mask_token(tokenizer, model_vocab_size: int) -> MaskPlan:
    """Add `<|mask|>` to `tokenizer` if missing; say whether the model's embedding must grow.

    Raises ValueError before any training when the tokenizer cannot take a new special token.
    """
    vocab = tokenizer.get_vocab()
    if MASK_TOKEN in vocab:
        mask_id = vocab[MASK_TOKEN]
        return MaskPlan(mask_id, max(model_vocab_size, mask_id + 1), added=False)
    if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "add_special_tokens"):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} cannot take a new special token {MASK_TOKEN}: use a fast tokenizer"
        )
    before = len(tokenizer)
    try:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [MASK_TOKEN]}, replace_extra_special_tokens=False
        )
    except TypeError:  # older transformers
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [MASK_TOKEN]}, replace_additional_special_tokens=False
        )
    vocab = tokenizer.get_vocab()
    if MASK_TOKEN not in vocab:
        raise ValueError(f"tokenizer refused the new special token {MASK_TOKEN}")
    mask_id = vocab[MASK_TOKEN]
    if mask_id != before:
        raise ValueError(
            f"tokenizer put {MASK_TOKEN} at id {mask_id}, expected the next free id {before}"
        )
    # A padded embedding matrix (len(tokenizer) < rows) has spare rows: the new id lands in one.
    return MaskPlan(mask_id, max(model_vocab_size, mask_id + 1), added=True)


def apply_mask_plan(model, plan: MaskPlan) -> None:
    """Grow the model's embeddings when the MASK id falls outside them (spare rows need nothing)."""
    rows = model.get_input_embeddings().weight.shape[0]
    if plan.new_vocab_size > rows:
        model.resize_token_embeddings(plan.new_vocab_size)
