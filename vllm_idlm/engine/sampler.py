"""The rejection sampler that runs for ISD steps inside vLLM's model runner.

It replaces `runner.rejection_sampler` when the speculative method is idlm. vLLM still
applies what it owns (penalties, bad words, allowed tokens, min-tokens, logprobs); the
acceptance / recovered / bonus math and the drafting from MASK rows are ours
(`vllm_idlm.verifier`), in one pass over the logits the forward already produced.

Draft slots vLLM scheduled for a request: `[d_0 .. d_{n-1}, MASK x m]`, so its logits rows
are `[last, d_0 .. d_{n-1}, MASK_1 .. MASK_m]` (the verifier's layout). MASK slots are
never emitted: with m >= 1 the step emits accepted drafts plus one recovered or bonus
token, and vLLM rolls back the KV of everything after it, MASK rows included.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler

from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.state import IsdState, StepDrafts
from vllm_idlm.verifier import verify_and_draft


def split_draft_slots(slot_ids: list[int], num_slots: list[int], mask_token_id: int):
    """Per request: (real draft ids, number of trailing MASK slots)."""
    drafts, num_masks, start = [], [], 0
    for count in num_slots:
        ids = slot_ids[start : start + count]
        start += count
        n = count
        while n and ids[n - 1] == mask_token_id:
            n -= 1
        drafts.append(ids[:n])
        num_masks.append(count - n)
    return drafts, num_masks


class IsdRejectionSampler(RejectionSampler):
    def __init__(
        self, sampler, spec_config, device, runner: Any, options: IsdOptions, state: IsdState
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self._runner = runner
        self.options = options
        self.state = state

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        mask_id = self.options.mask_token_id
        batch_size = len(metadata.num_draft_tokens)
        req_ids = list(self._runner.input_batch.req_ids)
        # Profiling / warm-up runs use dummy drafts and no live requests.
        is_dummy = len(req_ids) != batch_size
        drafts, num_masks = split_draft_slots(
            metadata.draft_token_ids.tolist(), metadata.num_draft_tokens, mask_id
        )
        num_drafts = [len(d) for d in drafts]

        # vLLM's own bonus sampling: the token for requests without MASK slots (drafting
        # off for them, e.g. structured outputs) and the bonus logprobs.
        bonus_output = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits"
            if self.is_processed_logprobs_mode
            else "raw_logits",
        )
        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = self.apply_logits_processors(
            raw_target_logits.clone(), sampling_metadata, metadata
        )
        rows = logits.to(torch.float32).clone()
        rows[metadata.target_logits_indices] = target_logits

        temperature = sampling_metadata.temperature
        if temperature is None or sampling_metadata.all_greedy:
            temperature = torch.zeros(batch_size, dtype=torch.float32, device=logits.device)
        step = verify_and_draft(
            rows,
            torch.tensor([t for d in drafts for t in d], dtype=torch.int64, device=logits.device),
            self._gather_draft_probs(req_ids, drafts, temperature, rows, is_dummy),
            num_drafts,
            num_masks,
            temperature,
            sampling_metadata.top_k,
            sampling_metadata.top_p,
            sampling_metadata.generators,
            mask_id,
        )
        output = torch.full(
            (batch_size, metadata.max_spec_len + 1),
            PLACEHOLDER_TOKEN_ID,
            dtype=torch.int32,
            device=logits.device,
        )
        output[:, : step.output_token_ids.shape[1]] = step.output_token_ids.to(torch.int32)
        num_accepted = step.num_accepted.tolist()
        bonus_ids = bonus_output.sampled_token_ids.view(-1)
        for i in range(batch_size):
            if num_masks[i] == 0 and num_accepted[i] == num_drafts[i]:
                output[i, num_drafts[i]] = bonus_ids[i]
        if not is_dummy:
            self._record(req_ids, num_drafts, num_masks, num_accepted, step, temperature)

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs,
                metadata,
                logits,
                self._processed(target_logits, metadata, sampling_metadata)
                if self.is_processed_logprobs_mode
                else raw_target_logits,
                bonus_output.logprobs_tensors.logprobs,
                output,
            )
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs_tensors)

    def _gather_draft_probs(self, req_ids, drafts, temperature, rows, is_dummy):
        """Stack the stored draft probs of this step's real drafts (random requests)."""
        vocab = rows.shape[-1]
        greedy = (temperature < 1e-5).tolist()
        if all(greedy):
            return None  # greedy drafts are argmaxes: the verifier needs no probs
        parts = []
        for i, d in enumerate(drafts):
            if not d:
                continue
            probs = None if (is_dummy or greedy[i]) else self.state.draft_probs.get(req_ids[i])
            if probs is None or probs.shape[0] < len(d):
                if not (is_dummy or greedy[i]):
                    raise RuntimeError(
                        f"idlm: no draft probabilities stored for request {req_ids[i]}; "
                        "refusing to verify sampled drafts without them"
                    )
                # Rows the verifier ignores (greedy request) or dummy-run filler.
                probs = torch.full((len(d), vocab), 1.0 / vocab, device=rows.device)
            parts.append(probs[: len(d)])
        if not parts:
            return None
        return torch.cat(parts).contiguous()

    def _record(self, req_ids, num_drafts, num_masks, num_accepted, step, temperature):
        """Keep the next drafts (and their probs) of requests whose drafts all passed."""
        k = self.options.num_drafts
        greedy = (temperature < 1e-5).tolist()
        next_drafts: list[list[int] | None] = []
        next_ids = step.next_draft_ids.tolist()
        start = 0
        for i, req_id in enumerate(req_ids):
            m = num_masks[i]
            self.state.draft_probs.pop(req_id, None)
            if m and num_accepted[i] == num_drafts[i]:
                next_drafts.append(next_ids[start : start + min(m, k)])
                if not greedy[i]:
                    self.state.draft_probs[req_id] = step.next_draft_probs[
                        start : start + min(m, k)
                    ].clone()
            else:
                next_drafts.append(None)
            start += m
            if m:
                self.state.num_steps += 1
                self.state.num_cold_starts += int(num_drafts[i] == 0)
        self.state.last_step = StepDrafts(req_ids, next_drafts)
        self.state.forget_except(set(self._runner.requests))

    def _processed(self, target_logits, metadata, sampling_metadata):
        from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

        return apply_sampling_constraints(
            target_logits.clone(), metadata.cu_num_draft_tokens, sampling_metadata
        )
