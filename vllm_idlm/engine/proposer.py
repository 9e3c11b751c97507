"""The ISD proposer vLLM's runner calls after each step (through `custom_class`).

It runs no model: the MASK rows of the step just verified already made their drafts (see
`engine.sampler`). Per request at k drafts (K, or the stride policy's choice for this step) it
submits `[d_0 .. d_{n-1}, MASK x m]`: the drafts are the MASK rows' (all of them, n <= K, also
past k: a probe's extra draft, or those in hand when k drops, cost only their rows)
and m = k MASK slots; or a lookup's (`engine.lookup`: in the request's own text, else in recent
outputs) followed by the MASK rows' drafts for the positions after it, where the policy prefers
the lookup, or the lookup's alone after a rejection, where the MASK rows have nothing (a cold
start is then `[MASK x k]`). A lookup's continuation may run to 2K - 1 tokens whatever k (a
match is a strong hint, and at small batches a row costs little beside the step), taking the
places of MASK slots within the 2K slots vLLM holds (m = min(k, 2K - n)). At k = 0 there is
no MASK slot: a request whose lookup has been right more often than a query row costs takes
its continuation alone (vLLM's ngram method, within ISD); the others decode plainly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY, IsdOptions
from vllm_idlm.engine.lookup import Lookup
from vllm_idlm.engine.state import IsdState, Proposal
from vllm_idlm.policy import PolicyConfig, StepTimes, StridePolicy
from vllm_idlm.seam.runner import RunnerView

# Step times before the engine has measured its own (seconds; a step, a query row).
PRIOR_STEP_S, PRIOR_ROW_S = 0.01, 1e-4


def make_policy(options: IsdOptions) -> StridePolicy:
    """The stride policy of `options`: its keys, and the step cost pinned by the user or a
    prior that the measurement at engine start replaces; with `"adaptive": false`, the fixed
    K (the policy then only chooses each request's draft source)."""
    settings = options.adaptive_settings
    ks = options.ks or tuple(range(1, options.num_drafts + 1))
    config = PolicyConfig(ks=ks, **settings)
    if not options.adaptive_on:
        return StridePolicy(config, StepTimes.linear(config.choices, 1.0, 1.0), options.num_drafts)
    if config.step_ms is not None:
        times = StepTimes.linear(config.choices, config.step_ms / 1e3, config.row_ms / 1e3)
    else:
        times = StepTimes.linear(config.choices, PRIOR_STEP_S, PRIOR_ROW_S)
        times.pinned = False
    return StridePolicy(config, times)


class IsdProposer:
    def __init__(self, vllm_config: Any) -> None:
        options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if options is None:
            raise RuntimeError(
                "idlm: the ISD proposer was started without its options; use "
                '"method": "idlm" in the speculative config instead of naming this class'
            )
        self.options = IsdOptions.from_dict(options)
        self.state = IsdState(policy=make_policy(self.options))
        self.lookup = None
        if self.options.lookup_on:
            model_config = getattr(vllm_config, "model_config", None)
            max_model_len = getattr(model_config, "max_model_len", 1 << 30)
            low, high = self.options.lookup_ngram
            self.lookup = Lookup(low, high, max_model_len, self.options.lookup_recent)
        self._runner: RunnerView | None = None

    def bind_runner(self, runner: RunnerView) -> None:
        self._runner = runner

    def load_model(self, target_model: Any) -> None:
        """Nothing to load: the target model drafts for itself."""

    def _params(self, req_id: str) -> Any:
        return self._runner.sampling_params(req_id) if self._runner is not None else None

    @staticmethod
    def _seeded_random(params: Any) -> bool:
        """A seeded random request: its tokens must repeat per seed whatever else runs, so
        neither its K nor its drafts may follow the machine's timings or other requests (the
        drafts a sample is verified against decide which of its exact draws it makes)."""
        if params is None or getattr(params, "seed", None) is None:
            return False
        return params.temperature >= 1e-5

    def _drafts_for(self, params: Any) -> bool:
        """Whether the request drafts at all. Structured outputs do not: grammar validation
        would strip MASK slots. Under the policy neither does a seeded random request (a fixed
        K drafts for it)."""
        if params is not None and params.structured_outputs is not None:
            return False
        return self.state.policy.fixed is not None or not self._seeded_random(params)

    def remember(self, output_ids: list[int]) -> None:
        """A finished request's output, for the lookups of the requests after it."""
        if self.lookup is not None:
            self.lookup.remember(output_ids)

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray | None = None,
        token_ids_cpu: np.ndarray | None = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        state, policy = self.state, self.state.policy
        req_ids = self._runner.req_ids
        params = [self._params(r) for r in req_ids]
        drafting = [
            bool(sampled) and self._drafts_for(p)
            for p, sampled in zip(params, sampled_token_ids, strict=True)
        ]
        self._score(req_ids, sampled_token_ids)
        k = policy.choose([r for r, d in zip(req_ids, drafting, strict=True) if d], len(req_ids))
        room = 2 * self.options.num_drafts - 1  # a lookup's most tokens: all slots but a MASK
        bar = policy.lookup_bar(len(req_ids)) if not k else 0.0
        proposals: list[list[int]] = []
        for i, (req_id, drafts_on) in enumerate(zip(req_ids, drafting, strict=True)):
            made, probs = state.pending.pop(req_id, ([], None))
            state.proposed.pop(req_id, None)
            if not drafts_on:
                proposals.append([])
                continue
            lookup = []
            if self.lookup is not None and token_ids_cpu is not None:
                tokens = token_ids_cpu[i, : num_tokens_no_spec[i]]
                shared = not self._seeded_random(params[i])  # other requests' outputs too
                lookup = self.lookup.propose(tokens, room, shared)
                state.offered[req_id] = (lookup[0] if lookup else None, made[0] if made else None)
            # At k = 0 (plain decoding for the batch) a request takes those of a lookup's
            # drafts alone that pay for their rows (no MASK slot, no MASK row for the adapter:
            # vLLM's ngram method, within ISD); scored either way.
            if not k and lookup:
                lookup = lookup[: policy.lookup_length(req_id, bar, len(lookup))]
            if lookup and made and not policy.prefers_lookup(req_id):
                lookup = []
            if not made and k and self.lookup is not None:
                policy.observe_cold(req_id, bool(lookup))
            # The MASK rows' drafts for the positions after the lookup's (their q~ was formed
            # without the lookup's tokens: any q~ the draft was drawn from verifies exactly).
            drafts = lookup + made[len(lookup) :]
            masks = k
            if lookup:  # within the 2K slots: a long lookup takes MASK slots' places
                drafts = drafts[:room]
                masks = min(k, room + 1 - len(drafts))
            if drafts:
                rest = probs[len(lookup) : len(drafts)] if probs is not None else None
                state.proposed[req_id] = Proposal(tuple(drafts), len(lookup), rest)
            proposals.append(self._slots(drafts, masks))
        return proposals

    def _slots(self, drafts: list[int], k: int) -> list[int]:
        """A request's draft slots: its drafts, then k MASK slots (padded to 2K under
        uniform_query_len); at k = 0, its drafts alone (verified, then plain decoding)."""
        if not k:
            return drafts
        if self.options.uniform_query_len:
            k = 2 * self.options.num_drafts - len(drafts)
        return drafts + [self.options.mask_token_id] * k

    def _score(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Each source's first draft for the step just run against the token the request
        emitted there (its first sampled token, whichever source was verified)."""
        offered, policy = self.state.offered, self.state.policy
        if not offered:
            return
        for req_id, tokens in zip(req_ids, sampled_token_ids, strict=True):
            first = offered.get(req_id)
            if first is not None and tokens:
                policy.score_sources(req_id, first[0], first[1], tokens[0])
        offered.clear()
