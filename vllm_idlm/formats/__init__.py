"""The files and conventions training writes and serving reads, defined once.

vLLM-free (the training package imports it): `checkpoint` holds the MASK token and an I-DLM
checkpoint's config (its MASK id, the strides N it was trained for, the architecture that
serves each model family); `adapter` holds the gated adapter's files (PEFT LoRA over the
target modules, plus the gate's facts and an optional trained MASK embedding row), with one
writer and one reader that both sides use.

Stride, as in ISD.md: a round of stride N verifies K = N - 1 drafts. Files record strides N
(`strides`, and the published layout's `block_size` = N - 1); the serving options and the
stride policy speak of K.
"""
