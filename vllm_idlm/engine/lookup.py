"""Lookup drafts: the continuation of the longest n-gram match in a request's own text, else in
the outputs of the requests that finished last.

The matcher is vLLM's own (its ngram method's, `ngram_proposer`; numba-compiled): the longest
suffix of the request's tokens, of `min_ngram` to `max_ngram` tokens, that occurred earlier in
its prompt or output, and up to k tokens that followed it there. Where the request's own text
has no match, the same matcher runs over the outputs of the last `recent` finished requests
followed by the request's last `max_ngram` tokens (answers to similar requests share their
phrasing, as suffix decoding's cache of past outputs exploits). A lookup draft is a point mass
(the matcher proposes one token for certain): verified with q = 1 at the token, it is accepted
with probability p(token) and the residual is p without the token (`idlm_kernels.isd_sample`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from vllm_idlm.seam.vllm import (
    _find_longest_matched_ngram_and_propose_tokens as _longest_match,
)

MAX_REMEMBERED = 1024  # the last tokens of a finished request's output a lookup keeps


class Lookup:
    def __init__(self, min_ngram: int, max_ngram: int, max_model_len: int, recent: int = 0):
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_model_len = max_model_len
        self.recent: deque[np.ndarray] = deque(maxlen=recent)
        self._corpus: np.ndarray | None = None
        # Compile the matcher now, not on a request's first step.
        self.propose(np.zeros(8, dtype=np.int32), 1)

    def remember(self, output_ids: list[int]) -> None:
        """A finished request's output (placeholders, -1, dropped)."""
        if self.recent.maxlen:
            kept = np.asarray([t for t in output_ids[-MAX_REMEMBERED:] if t >= 0], np.int32)
            if kept.shape[0] > self.min_ngram:
                self.recent.append(kept)
                self._corpus = None

    def propose(self, tokens: np.ndarray, k: int, shared: bool = False) -> list[int]:
        """Up to k tokens after the longest match of the end of `tokens` (a request's prompt and
        output so far) earlier in them, or with `shared`, where they have none, in the recent
        outputs; [] where nothing matches."""
        k = min(k, self.max_model_len - tokens.shape[0])
        if k <= 0 or tokens.shape[0] < self.min_ngram:
            return []
        found = _longest_match(tokens, self.min_ngram, self.max_ngram, 1 << 30, k)
        if found.shape[0] or not shared or not self.recent:
            return found.tolist()
        tail = tokens[-self.max_ngram :]
        if self._corpus is None:  # the recent outputs, then room for a request's last tokens
            self._corpus = np.concatenate([*self.recent, np.zeros(self.max_ngram, np.int32)])
        text = self._corpus[: self._corpus.shape[0] - self.max_ngram + tail.shape[0]]
        text[-tail.shape[0] :] = tail
        return _longest_match(text, self.min_ngram, self.max_ngram, 1 << 30, k).tolist()
