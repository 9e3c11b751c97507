"""Lookup drafts: the continuation of the longest n-gram match in a request's own text.

The matcher is vLLM's own (its ngram method's, `ngram_proposer`; numba-compiled): the longest
suffix of the request's tokens, of `min_ngram` to `max_ngram` tokens, that occurred earlier in
its prompt or output, and up to k tokens that followed it there. A lookup draft is a point mass
(the matcher proposes one token for certain): verified with q = 1 at the token, it is accepted
with probability p(token) and the residual is p without the token (`idlm_kernels.isd_sample`).
"""

from __future__ import annotations

import numpy as np

from vllm_idlm.seam.vllm import (
    _find_longest_matched_ngram_and_propose_tokens as _longest_match,
)


class Lookup:
    def __init__(self, min_ngram: int, max_ngram: int, max_model_len: int) -> None:
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_model_len = max_model_len
        # Compile the matcher now, not on a request's first step.
        self.propose(np.zeros(8, dtype=np.int32), 1)

    def propose(self, tokens: np.ndarray, k: int) -> list[int]:
        """Up to k tokens after the longest match of the end of `tokens` (a request's prompt and
        output so far) earlier in them; [] where nothing matches."""
        if k <= 0 or tokens.shape[0] < self.min_ngram:
            return []
        found = _longest_match(tokens, self.min_ngram, self.max_ngram, self.max_model_len, k)
        return found.tolist()
