"""Each team's rewards dry runs in progress (``POST /v1/rewards/run``), bounded by
``GRPO_REWARD_TRIAL_SLOTS_PER_TEAM`` across every API process, so that one team's dry runs cannot
hold every slot another team's dry run needs: the API's own (``GRPO_REWARD_TRIAL_SLOTS`` per
process, in which a dry run is checked and, when it needs no worker, scored) and the pool's
sandbox workers' queue, which takes relayed dry runs in the order they came.

The same Redis slots as uploads' (:class:`api.store.upload_slots.UploadSlots`: a sorted set per
team, renewed while the dry run lasts, a lost one dropped after two minutes, counted in the
process while Redis is out), under a key of their own and with their own refusal: a team at its
share gets a 429 with ``Retry-After`` at once rather than a place in a line.
"""

from __future__ import annotations

from api.domain.errors import RateLimited
from api.store.upload_slots import UploadSlots

# A dry run lasts seconds (its rewards' budget is at most 30 s each); one of the team's ends soon.
RETRY_AFTER_SECONDS = 5


class RewardTrialSlots(UploadSlots):
    """One per API process (on ``app.state``); used from the event loop only."""

    kind = "rewards dry run slots"

    def _key(self, team_id: int) -> str:
        return self._keys.reward_trial_slots(team_id)

    def _refusal(self, limit: int) -> RateLimited:
        return RateLimited(f"your team already has {limit} rewards dry runs in progress, the most it may "
                           "have at once (GRPO_REWARD_TRIAL_SLOTS_PER_TEAM); retry once one has finished",
                           retry_after=RETRY_AFTER_SECONDS)
