"""What the draft slots vLLM scheduled for a request hold: real drafts, then other rows.

vLLM-free. ISD proposes `[d_0 .. d_{n-1}, MASK x m]` per request, but vLLM's scheduler
does not always schedule what was proposed:

- it pads a new decode (a prefix-cache hit leaving one token to compute, a request
  resumed after preemption) to the full speculative length with placeholder slots `-1`;
- it trims the tail of the slots to fit the token budget, `max_tokens` or
  `max_model_len`, so MASK slots, or drafts too, may be missing;
- grammar validation may cut drafts (ISD does not draft for structured outputs);
- near `max_model_len` vLLM replaces every request's proposal with zeros unless the
  plugin stops it (it does; more than K leading real-looking slots are treated as such
  filler all the same).

Whatever arrives, a request's logits rows are `[last, d_0 .. d_{n-1}, r_1 .. r_m]`, where
the real drafts are the leading slots that are neither MASK nor negative and the rows
after them are MASK rows or placeholders. The verifier checks the real drafts and treats
the other rows as MASK rows; their outputs may become the next drafts only when every one
of them really was a MASK.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def num_real_drafts(slot_ids: Sequence[int], mask_token_id: int, max_drafts: int) -> int:
    """The leading slots that are real drafts (neither MASK nor a placeholder); 0 when
    there are more than `max_drafts` (K) of them: ISD never proposes that many, so they
    are filler vLLM put there, not drafts."""
    n = 0
    while n < len(slot_ids) and slot_ids[n] >= 0 and slot_ids[n] != mask_token_id:
        n += 1
    return n if n <= max_drafts else 0


@dataclass(frozen=True)
class SlotPlan:
    """Per request of one step: the real drafts and the rows after the bonus row."""

    drafts: tuple[tuple[int, ...], ...]
    num_rows_after: tuple[int, ...]  # MASK rows, or placeholder rows whose outputs are unused
    keeps_next_drafts: tuple[bool, ...]  # the rows after are all MASK rows

    @property
    def num_draft_tokens(self) -> list[int]:
        return [len(d) for d in self.drafts]

    @property
    def draft_token_ids(self) -> list[int]:
        return [t for d in self.drafts for t in d]

    def without_drafts(self, indices: Iterable[int]) -> SlotPlan:
        """Requests at `indices` become cold starts: their drafts are not verified (their rows
        are ignored) and the next step has no drafts for them. Row 0 still gives the next
        token, so the output stays exact."""
        drop = set(indices)
        if not drop:
            return self
        drafts, after, keeps = list(self.drafts), list(self.num_rows_after), []
        for i in range(len(drafts)):
            if i in drop:
                after[i] += len(drafts[i])
                drafts[i] = ()
            keeps.append(self.keeps_next_drafts[i] and i not in drop)
        return SlotPlan(tuple(drafts), tuple(after), tuple(keeps))


def plan_slots(slots: Sequence[Sequence[int]], mask_token_id: int, max_drafts: int) -> SlotPlan:
    drafts, after, keeps = [], [], []
    for ids in slots:
        n = num_real_drafts(ids, mask_token_id, max_drafts)
        rest = ids[n:]
        drafts.append(tuple(ids[:n]))
        after.append(len(rest))
        keeps.append(bool(rest) and all(t == mask_token_id for t in rest))
    return SlotPlan(tuple(drafts), tuple(after), tuple(keeps))
