"""The ISD proposer vLLM's runner calls after each step (through `custom_class`).

It runs no model: the drafts were already made by the MASK rows of the step just
verified (see `engine.sampler`). It submits, per request at stride k (K, or the adaptive
policy's choice for this step), `[d_0 .. d_{n-1}, MASK x k]` after a fully accepted step
and `[MASK x k]` (a cold start) otherwise. The drafts are all those the last step's MASK rows
made (n <= K; fewer where vLLM trimmed MASK slots), also when n > k: a probe's extra draft,
or the drafts in hand when the policy lowers k, are verified for the price of their rows.
On the step after a plain batch's joint probe, greedy probe drafts are not verified but scored
against the tokens the requests then emit, so that the step stays plain and every request
emits one token (`IsdProposer._plain_step`).
"""

from __future__ import annotations

from typing import Any

from vllm_idlm.adaptive import StridePolicy
from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.config import ADDITIONAL_CONFIG_KEY, POLICY_KEYS, IsdOptions
from vllm_idlm.engine.state import IsdState
from vllm_idlm.step_cost import StepCost

# Step cost before the engine has measured its own (seconds, seconds per query row).
PRIOR_COST = StepCost(a=0.01, b=1e-4, d=5e-4)


def make_policy(options: IsdOptions) -> StridePolicy:
    """The stride policy of `options`: its knobs, and the step cost pinned by the user or
    the prior that calibration replaces."""
    settings = options.adaptive_settings
    strides = options.strides or tuple(range(1, options.num_drafts + 1))
    knobs = {k: settings[k] for k in POLICY_KEYS & set(settings)}
    if "step_ms" in settings:
        cost = StepCost(
            a=settings["step_ms"] / 1e3,
            b=settings["row_ms"] / 1e3,
            d=settings.get("draft_path_ms", 0.0) / 1e3,
            e=settings.get("draft_request_ms", 0.0) / 1e3,
            m=settings.get("mask_slot_ms", 0.0) / 1e3,
            pinned=True,
        )
    else:
        cost = StepCost(PRIOR_COST.a, PRIOR_COST.b, PRIOR_COST.d)
    return StridePolicy(AdaptiveConfig(strides=strides, **knobs), cost)


class IsdProposer:
    def __init__(self, vllm_config: Any) -> None:
        options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if options is None:
            raise RuntimeError(
                "idlm: the ISD proposer was started without its options; use "
                '"method": "idlm" in the speculative config instead of naming this class'
            )
        self.options = IsdOptions.from_dict(options)
        self.state = IsdState()
        if self.options.adaptive_on:
            self.state.policy = make_policy(self.options)
        self._runner: Any = None

    def bind_runner(self, runner: Any) -> None:
        self._runner = runner

    def load_model(self, target_model: Any) -> None:
        """Nothing to load: the target model drafts for itself."""

    def _params(self, req_id: str) -> Any:
        request = self._runner.requests.get(req_id) if self._runner is not None else None
        return getattr(request, "sampling_params", None)

    @staticmethod
    def _drafting_enabled(params: Any) -> bool:
        # Grammar validation would strip MASK slots; structured outputs decode plainly.
        return params is None or params.structured_outputs is None

    @staticmethod
    def _seeded(params: Any) -> bool:
        """A seeded random request: its tokens depend on how many draws each step makes."""
        return getattr(params, "seed", None) is not None and params.temperature > 0

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any):
        mask_id = self.options.mask_token_id
        num_slots = 2 * self.options.num_drafts if self.options.uniform_query_len else None
        pending, stored = self.state.pending, self.state.draft_probs
        req_ids = list(self._runner.input_batch.req_ids)
        params = [self._params(r) for r in req_ids]
        drafting = [
            bool(sampled) and self._drafting_enabled(p)
            for p, sampled in zip(params, sampled_token_ids)  # noqa: B905
        ]
        self._score(req_ids, sampled_token_ids)
        policy = self.state.policy
        probes_in_hand = policy is not None and policy.chose_plain  # before choosing anew
        chosen = self._strides(
            [r for r, d in zip(req_ids, drafting) if d],  # noqa: B905
            [p for p, d in zip(params, drafting) if d],  # noqa: B905
        )
        strides = iter(chosen)
        drop, score = self._plain_step(req_ids, params, drafting, chosen, probes_in_hand)
        proposals: list[list[int]] = []
        for req_id, drafts_on in zip(req_ids, drafting):  # noqa: B905
            drafts = pending.pop(req_id, None) or []
            k = next(strides) if drafts_on else 0
            if not drafts_on:
                drafts = []
            elif drafts and drop:
                if req_id in score:
                    self.state.scoring.setdefault(req_id, (drafts, 0))
                drafts = []
            # Otherwise every draft in hand is verified, also past the stride taken now (the
            # step after a probe, or after the policy lowered k or stopped drafting): they
            # cost only their rows, and their verdicts are what observes those positions.
            if not drafts:
                stored.pop(req_id, None)
            if k == 0:
                proposals.append(drafts)  # no MASK slots: plain decoding after these
                continue
            num_masks = num_slots - len(drafts) if num_slots else k
            proposals.append(drafts + [mask_id] * num_masks)
        pending.clear()
        return proposals

    def _plain_step(
        self,
        req_ids: list[str],
        params: list[Any],
        drafting: list[bool],
        chosen: list[int],
        probes_in_hand: bool,
    ) -> tuple[bool, set[str]]:
        """Whether the drafts in hand are all dropped this step, and the requests whose
        dropped drafts are scored against the tokens they then emit (`_score`).

        A plain batch's step after its joint probe (every stride 0 then and now:
        `probes_in_hand`) would take the speculative path only to verify the probes'
        drafts, and a request whose draft passes emits two tokens: a batch whose requests
        ran in step (equal lengths, finishing together and prefilling their successors in
        one step) falls out of step. So greedy drafts are not verified there but scored: a
        greedy verdict is whether the draft is the target's argmax, which is the token plain
        decoding then emits, so the verdicts are those verification would give, one step
        later, and the step stays plain. A random request's verdict needs the draft's
        probability against the target's, which a plain step does not keep: its drafts are
        verified (and the greedy ones with them, the step being speculative anyway). The
        drafts a batch holds as it stops drafting are verified as before: they are the
        batch's own, up to K per request, and worth their rows. A plain probe drops all
        drafts (`probing_plain`), and scores the greedy ones. `score_plain` off: nothing is
        scored, and only a plain probe drops drafts."""
        policy = self.state.policy
        if policy is None:
            return False, set()
        if not self.state.pending or not policy.config.score_plain:
            return policy.probing_plain, set()
        in_hand = [
            (r, p)
            for r, p, d in zip(req_ids, params, drafting)  # noqa: B905
            if d and self.state.pending.get(r)
        ]
        greedy = {r for r, p in in_hand if self._greedy(p)}
        plain_again = probes_in_hand and not any(chosen)
        if policy.probing_plain or (plain_again and len(greedy) == len(in_hand)):
            return True, greedy
        return False, set()

    def _score(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Verdicts of scored drafts (`_plain_step`) from the tokens the requests emitted
        this step: the drafts that match the emitted tokens in order are the ones greedy
        verification would have accepted; the first that does not, or the last, closes the
        request's verdict for the policy."""
        scoring, policy = self.state.scoring, self.state.policy
        if not scoring or policy is None:
            return
        for req_id, tokens in zip(req_ids, sampled_token_ids):  # noqa: B905
            entry = scoring.get(req_id)
            if entry is None or not tokens:
                continue
            drafts, matched = entry
            done = False
            for token in tokens:
                if token != drafts[matched]:
                    done = True
                    break
                matched += 1
                if matched == len(drafts):
                    done = True
                    break
            if done:
                del scoring[req_id]
                policy.observe(req_id, len(drafts), matched)
                self.state.num_scored += 1
            else:
                scoring[req_id] = (drafts, matched)

    @staticmethod
    def _greedy(params: Any) -> bool:
        return params is not None and getattr(params, "temperature", 1.0) < 1e-5

    def _strides(self, req_ids: list[str], params: list[Any]) -> list[int]:
        """K for each drafting request's next step: the policy's choice, or the fixed K.
        Under the policy a seeded random request decodes plainly (k = 0): the policy's
        choices follow the machine's timings and the other requests, and a seed must give
        the same tokens on every call, so its stride may not depend on them; plain decoding
        is the one stride that never loses to plain decoding. A fixed K drafts for it."""
        policy = self.state.policy
        if policy is None:
            return [self.options.num_drafts] * len(req_ids)
        seeded = [self._seeded(p) for p in params]
        if not any(seeded):
            return policy.choose(req_ids)
        chosen = iter(policy.choose([r for r, s in zip(req_ids, seeded, strict=True) if not s]))
        return [0 if s else next(chosen) for s in seeded]
