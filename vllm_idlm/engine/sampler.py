"""The rejection sampler that runs for ISD steps inside vLLM's model runner.

It replaces `runner.rejection_sampler` when the speculative method is idlm. vLLM still
applies what it owns (penalties, bad words, allowed tokens, min-tokens, temperature and its
own top-k / top-p filter, logprobs), on every row; the acceptance / recovered / bonus math
and the drafting from MASK rows are ours (`vllm_idlm.verifier`), in one pass over the
logits the forward already produced. vLLM's bonus sampler never runs: a request's random
numbers then come from its own generator in an order fixed by its own rows, whatever else
is in the batch. One exception: a seeded random request with no draft to verify and none
to make (under the adaptive policy, every seeded request) gets its token from vLLM's own
sampler (`Sampler.sample`'s temperature and top-k / top-p sampler, on its row, with its
generator), so that it draws what plain decoding draws and a batch of such requests may take
vLLM's plain path (`vllm_idlm.engine.runner`) without its tokens changing.

Draft slots vLLM scheduled for a request: `[d_0 .. d_{n-1}, MASK x m]`, or whatever
vLLM made of them (placeholders, trimmed tails; see `vllm_idlm.slots`), so its logits rows
are `[last, d_0 .. d_{n-1}, r_1 .. r_m]` (the verifier's layout). MASK slots are never
emitted: with m >= 1 the step emits accepted drafts plus one recovered or bonus token,
and vLLM rolls back the KV of everything after it, MASK rows included.

One filter everywhere: the target distribution of every row is formed as vLLM's sampler
forms a plain step's row, in its order: the request's logits processors (logit bias before
the penalties), temperature, min-p, then vLLM's top-k / top-p (ties resolved as vLLM
resolves them on this platform). Temperature and the filter are vLLM's own functions for
speculative rows (`apply_sampling_constraints`, `apply_top_k_top_p`), logit bias and min-p
its own processors applied row by row (`engine.logitsprocs`), so every emitted token of a
request is drawn from the same kind of distribution, and every MASK row's draft probs are
those of the processed distribution. The verifier then sees temperature 1 and no filter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

from idlm_kernels.argmax import argmax_without
from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.logitsprocs import apply_to_every_row, row_processors
from vllm_idlm.engine.state import IsdState
from vllm_idlm.seam import vllm as seam_vllm
from vllm_idlm.seam.runner import RunnerView
from vllm_idlm.seam.vllm import (
    PLACEHOLDER_TOKEN_ID,
    MinTokensLogitsProcessor,
    RejectionSampler,
    SamplerOutput,
    apply_sampling_constraints,
    apply_top_k_top_p,
)
from vllm_idlm.slots import SlotPlan, plan_slots
from vllm_idlm.verifier import sample_without_drafts, verify_and_draft, verify_greedy

logger = logging.getLogger("vllm_idlm")


@dataclass(frozen=True)
class _Batch:
    """The host-side facts of one step, in the runner's batch order."""

    req_ids: list[str]
    slots: list[list[int]]
    greedy: list[bool]
    live: bool  # False for vLLM's profiling / warm-up runs (dummy drafts, no requests)

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy)


def needs_logits_processing(sampling_metadata) -> bool:
    """Whether vLLM's per-request logits processors change any target row this step."""
    sm = sampling_metadata
    if not sm.no_penalties or sm.bad_words_token_ids or sm.allowed_token_ids_mask is not None:
        return True
    if any(
        isinstance(p, MinTokensLogitsProcessor) and p.min_toks
        for p in sm.logitsprocs.non_argmax_invariant
    ):
        return True
    holder = getattr(sm, "thinking_budget_state_holder", None)
    return holder is not None and holder.has_tracked_requests()


class IsdRejectionSampler(RejectionSampler):
    def __init__(
        self, sampler, spec_config, device, runner: RunnerView, options: IsdOptions, state: IsdState
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self._runner = runner
        self.options = options
        self.state = state

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        sm = sampling_metadata
        width = metadata.max_spec_len + 1
        # Named ids (`logprob_token_ids`) also set `max_num_logprobs` (their count).
        want_logprobs = sm.max_num_logprobs is not None or bool(sm.logprob_token_ids)
        if want_logprobs:
            logprob_rows = self._logprob_row_indices(metadata, width, logits.shape[0])
        raw_rows = (
            logits[logprob_rows].float()
            if want_logprobs and not self.is_processed_logprobs_mode
            else None
        )
        batch = self._batch(metadata, sm) if metadata.max_spec_len else None
        plan = (
            plan_slots(batch.slots, self.options.mask_token_id, self.options.max_drafts)
            if batch is not None
            else None
        )
        drawn, drawn_rows = self._drawn_as_vllm_draws(plan, sm, len(metadata.num_draft_tokens))
        rows, unfiltered = self._target_rows(logits, metadata, sm, drawn_rows)
        # Generators of the requests vLLM's sampler draws for stay out of the ISD draws.
        generators = {i: g for i, g in sm.generators.items() if i not in drawn}
        if metadata.max_spec_len == 0:
            output = self._sample_without_slots(rows, sm, generators)
        else:
            output = self._verify_and_draft(batch, plan, rows, sm, width, generators)
        if drawn:
            index = torch.tensor(drawn, dtype=torch.int64, device=output.device)
            tokens = self._draw_as_vllm(unfiltered, drawn, index, sm)
            output[index, 0] = tokens.to(output.dtype)

        logprobs_tensors = None
        if want_logprobs:
            source = raw_rows if raw_rows is not None else rows[logprob_rows]
            logprobs = (
                source if self.is_logits_logprobs_mode else self.sampler.compute_logprobs(source)
            )
            tokens = output.flatten().to(torch.int64)
            tokens[tokens == PLACEHOLDER_TOKEN_ID] = 0
            logprobs_tensors = self._gather_logprobs(logprobs, tokens, sm, width)
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs_tensors)

    def _gather_logprobs(self, logprobs: torch.Tensor, tokens: torch.Tensor, sm, width: int):
        """The logprobs of every (request, position) row as vLLM's sampler reports a plain
        step's: where a request of the batch names its ids (`logprob_token_ids`), every
        request gets the named form (vLLM's sampler prefers it for the whole batch); vLLM's
        rejection sampler reports the top ones instead, which the output cannot carry."""
        if not sm.logprob_token_ids:
            return self.sampler.gather_logprobs(logprobs, sm.max_num_logprobs, tokens)
        named = {
            i * width + j: ids for i, ids in sm.logprob_token_ids.items() for j in range(width)
        }
        return self.sampler.gather_specific_token_logprobs(logprobs, named, tokens)

    def _sample_without_slots(self, rows: torch.Tensor, sm, generators) -> torch.Tensor:
        """A step in which no request carries a draft slot (the whole batch decodes plainly):
        one row per request, no ISD state to keep. [requests, 1] int32."""
        temperature = None if sm.all_greedy else (sm.temperature >= 1e-5).to(torch.float32)
        ids = sample_without_drafts(
            rows, temperature, generators, self.options.mask_token_id, sm.all_greedy
        )
        return ids.to(torch.int32).view(-1, 1)

    def _verify_and_draft(
        self, batch: _Batch, plan: SlotPlan, rows: torch.Tensor, sm, width: int, generators
    ) -> torch.Tensor:
        """Verify every request's drafts and draft from its MASK rows; keeps the next drafts
        in the ISD state. [requests, width] int32, placeholders after the emitted tokens."""
        device = rows.device
        if batch.all_greedy and device.type == "cpu":
            return self._verify_greedy(batch, plan, rows, width)
        plan, probs, index = self._draft_probs(plan, batch, rows.shape[-1], device)
        step = verify_and_draft(
            rows,
            torch.tensor(plan.draft_token_ids, dtype=torch.int64, device=device),
            probs,
            plan.num_draft_tokens,
            list(plan.num_rows_after),
            self._verifier_temperature(batch, sm, device),
            None,  # top-k / top-p: already applied by vLLM's filter above
            None,
            generators,
            self.options.mask_token_id,
            all_greedy=batch.all_greedy,
            draft_prob_index=index,
        )
        num_reqs = len(batch.slots)
        host = torch.cat([step.num_accepted, step.next_draft_ids]).tolist()  # the one sync
        num_accepted, next_ids = host[:num_reqs], host[num_reqs:]

        output = torch.full(
            (num_reqs, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device
        )
        output[:, : step.output_token_ids.shape[1]] = step.output_token_ids.to(torch.int32)
        if batch.live:
            self._record(batch, plan, num_accepted, next_ids, step.next_draft_probs)
        return output

    def _verify_greedy(
        self, batch: _Batch, plan: SlotPlan, rows: torch.Tensor, width: int
    ) -> torch.Tensor:
        """`_verify_and_draft` for an all-greedy batch on CPU: one argmax over the rows, the
        rest on the host (`verifier.verify_greedy`), in place of the reference's ~100 small
        tensor operations (~0.3 ms a step at 8 requests on the demo models)."""
        row_ids = argmax_without(rows, self.options.mask_token_id).tolist()
        emitted, num_accepted, next_ids = verify_greedy(row_ids, plan.drafts, plan.num_rows_after)
        output = torch.tensor(
            [tokens + [PLACEHOLDER_TOKEN_ID] * (width - len(tokens)) for tokens in emitted],
            dtype=torch.int32,
        )
        if batch.live:
            self._record(batch, plan, num_accepted, next_ids, None)
        return output

    def _batch(self, metadata, sm) -> _Batch:
        num_slots = list(metadata.num_draft_tokens)
        req_ids = self._runner.req_ids
        if len(req_ids) == len(num_slots):
            # Host copies of the scheduled slots (no device sync).
            slots = self._runner.scheduled_slots(len(req_ids))
            if [len(s) for s in slots] == num_slots:
                if sm.all_greedy or sm.all_random:
                    greedy = [sm.all_greedy] * len(req_ids)
                else:
                    greedy_ids = self._runner.greedy_req_ids
                    greedy = [r in greedy_ids for r in req_ids]
                return _Batch(req_ids, slots, greedy, live=True)
        # vLLM's dummy runs (profiling, warm-up): read the dummy drafts off the device.
        flat, slots = metadata.draft_token_ids.tolist(), []
        for count in num_slots:
            slots.append(flat[:count])
            flat = flat[count:]
        if sm.all_greedy or sm.temperature is None:
            greedy = [True] * len(num_slots)
        else:
            greedy = (sm.temperature < 1e-5).tolist()
        return _Batch([""] * len(num_slots), slots, greedy, live=False)

    def _draft_probs(self, plan: SlotPlan, batch: _Batch, vocab: int, device):
        """The draft probs of this step's drafts and each draft's row among them (-1: a point
        mass, a lookup's), and the plan with every random request whose drafts cannot be
        paired with what was proposed made a cold start. (None, None) when no random request
        has drafts: greedy drafts are verified by equality."""
        if not any(d and not g for d, g in zip(plan.drafts, batch.greedy, strict=True)):
            return plan, None, None
        parts: list[torch.Tensor] = []
        index: list[int] = []
        rows = 0
        unverifiable: list[int] = []
        for i, drafts in enumerate(plan.drafts):
            if not drafts:
                continue
            if batch.greedy[i]:
                index += [-1] * len(drafts)  # never read: greedy rows compare argmaxes
                continue
            proposal = self.state.proposed.get(batch.req_ids[i])
            if proposal is None or not proposal.matching(drafts):
                unverifiable.append(i)
                continue
            lookup = min(proposal.num_lookup, len(drafts))
            held = len(drafts) - lookup
            index += [-1] * lookup + list(range(rows, rows + held))
            if held:
                parts.append(proposal.probs[:held])
                rows += held
        if unverifiable:
            if batch.live:
                self.state.num_unverifiable += len(unverifiable)
                logger.warning(
                    "idlm: %d request(s) arrived with drafts that were not proposed for them; "
                    "their drafts are ignored this step (output unchanged)",
                    len(unverifiable),
                )
            return self._draft_probs(plan.without_drafts(unverifiable), batch, vocab, device)
        if parts:
            probs = torch.cat(parts).to(device)
        else:  # every random draft a point mass: no probs row at all
            probs = torch.zeros(0, vocab, dtype=torch.float32, device=device)
        return plan, probs, torch.tensor(index, dtype=torch.int64, device=device)

    @staticmethod
    def _logprob_row_indices(metadata, width: int, num_rows: int) -> torch.Tensor:
        """Row of every (request, output position) pair, as vLLM lays out logprobs."""
        start = torch.zeros_like(metadata.cu_num_sampled_tokens)
        start[1:] = metadata.cu_num_sampled_tokens[:-1]
        offsets = torch.arange(width, device=start.device, dtype=start.dtype)
        return (start[:, None] + offsets[None, :]).flatten().clamp_(max=num_rows - 1).long()

    def _target_rows(
        self, logits: torch.Tensor, metadata, sm, keep_rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 logits with vLLM's logits processors, temperature, min-p and top-k / top-p
        applied (in place where the logits already are fp32, as vLLM's own sampler does), and
        a copy of `keep_rows` as they were before top-k / top-p (None without any).

        Every row is processed as a target row, the last one of each request included
        (vLLM would send that one through its bonus sampler): in vLLM's terms each request
        gets one more draft slot, a filler that no row ever reads as context.
        """
        rows = logits if logits.dtype == torch.float32 else logits.float()
        num_rows = [n + 1 for n in metadata.num_draft_tokens]
        bias, min_p = row_processors(sm)
        if bias is not None:
            # Before the penalties, as vLLM's sampler orders them (a repetition penalty
            # scales the biased logit); the -inf masks applied there commute with it.
            rows = apply_to_every_row(bias, rows, num_rows)
        if needs_logits_processing(sm):
            every_row = SimpleNamespace(num_draft_tokens=num_rows)
            spec = [list(s) + [0] for s in sm.spec_token_ids[: len(num_rows)]]
            rows = self.apply_logits_processors(rows, replace(sm, spec_token_ids=spec), every_row)
        cu_num_rows = metadata.cu_num_sampled_tokens
        if not sm.all_greedy:
            # Temperature alone (the filter comes after min-p), with greedy rows at 1.
            rows = apply_sampling_constraints(
                rows, cu_num_rows, replace(sm, top_k=None, top_p=None)
            )
            if min_p is not None:
                rows = apply_to_every_row(min_p, rows, num_rows)
        unfiltered = None
        if keep_rows:
            unfiltered = rows[torch.tensor(keep_rows, dtype=torch.int64, device=rows.device)]
        if not sm.all_greedy and (sm.top_k is not None or sm.top_p is not None):
            expand = seam_vllm.expand_batch_to_tokens  # as patched on CPU (`cpu_fixes`)
            num = rows.shape[0]
            top_k = None if sm.top_k is None else expand(sm.top_k, cu_num_rows, num)
            top_p = None if sm.top_p is None else expand(sm.top_p, cu_num_rows, num)
            rows = apply_top_k_top_p(rows, top_k, top_p)
        return rows, unfiltered

    @staticmethod
    def _drawn_as_vllm_draws(
        plan: SlotPlan | None, sm, num_reqs: int
    ) -> tuple[list[int], list[int]]:
        """The seeded random requests whose token vLLM's own sampler draws this step, and
        their rows: those with no draft to verify and no MASK row whose draft is kept (under
        the adaptive policy, every seeded request on every step). Their one emitted token
        comes from their first row, as on a plain step; drawn as vLLM draws it, from their
        generator, it is the token plain decoding draws, whichever path the step takes and
        whatever else it carries. `plan` None: no request carries a slot."""
        if not sm.generators:
            return [], []
        drawn, rows, row = [], [], 0
        for i in range(num_reqs):
            n = len(plan.drafts[i]) if plan is not None else 0
            after = plan.num_rows_after[i] if plan is not None else 0
            if i in sm.generators and not n and not (after and plan.keeps_next_drafts[i]):
                drawn.append(i)
                rows.append(row)
            row += 1 + n + after
        return drawn, rows

    def _draw_as_vllm(
        self, unfiltered: torch.Tensor, drawn: list[int], index: torch.Tensor, sm
    ) -> torch.Tensor:
        """The tokens vLLM's `Sampler.sample` draws for the requests at `index` (random, each
        with its generator) from their processed rows (temperature and min-p applied, as
        `_target_rows` applies them): its platform's top-k / top-p sampler, which draws every
        row from that row's generator alone."""
        generators = {j: sm.generators[i] for j, i in enumerate(drawn)}
        top_k = None if sm.top_k is None else sm.top_k[index]
        top_p = None if sm.top_p is None else sm.top_p[index]
        tokens, _ = self.sampler.topk_topp_sampler(unfiltered, generators, top_k, top_p)
        return tokens

    @staticmethod
    def _verifier_temperature(batch: _Batch, sm, device) -> torch.Tensor:
        """0 for greedy requests, 1 for random ones (their rows are already scaled)."""
        if batch.all_greedy:
            return torch.zeros(len(batch.greedy), dtype=torch.float32, device=device)
        return (sm.temperature >= 1e-5).to(torch.float32)

    def _record(self, batch: _Batch, plan: SlotPlan, num_accepted, next_ids, next_probs) -> None:
        """Keep the next drafts (and their probs) of requests whose drafts all passed; hand the
        verdicts to the policy and count them per source."""
        k = self.options.num_drafts
        state, policy = self.state, self.state.policy
        counts = state.step_sources = type(state.step_sources)()
        start = 0
        for i, req_id in enumerate(batch.req_ids):
            m = plan.num_rows_after[i]
            n = len(plan.drafts[i])
            state.pending.pop(req_id, None)
            proposal = state.proposed.pop(req_id, None)
            if n:
                lookup = proposal.num_lookup if proposal is not None else 0
                # The stride is judged on the MASK rows' drafts alone: lookups draft at every
                # K, 0 included, and are scored apart (`StridePolicy.score_sources`).
                if policy is not None and not lookup:
                    policy.observe(req_id, n, num_accepted[i])
                counts.add(n, num_accepted[i], lookup)
            if m and plan.keeps_next_drafts[i] and num_accepted[i] == n:
                drafts = next_ids[start : start + min(m, k)]
                probs = None
                if not batch.greedy[i]:
                    probs = next_probs[start : start + len(drafts)].clone()
                state.pending[req_id] = (drafts, probs)
            start += m
            if m:
                state.num_steps += 1
                state.num_cold_starts += int(n == 0)
        state.sources.add_counts(counts)
