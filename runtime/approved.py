"""A parked run's approved cards run on their approval (design note 60).

A step that proposed several cards waits for every one of them before the model is
told anything; but an approved card does not wait for its siblings to be executed: the
person who clicked "approve" sees it run, as a card alone in its run does. Its outcome
is kept on the card, where the model is told it from once every card is decided; and a
new message that supersedes the run meanwhile no longer throws the approval away (only
a card still ``approved``, not started, is invalidated then: design note 17)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import UnknownTool
from signoff.runtime.execution import Executor
from signoff.runtime.records import Run
from signoff.runtime.slots import Slot
from signoff.runtime.tools import Registry, ToolContext


def open_calls(run: Run, waiting: Mapping[str, str]) -> list[str]:
    """The run's calls, in the model's order, whose outcome a card holds (not a result
    the run's state already keeps: a read, a refusal)."""
    results = run.state.get("results", {})
    return [u for u in run.state.get("order", []) if u not in results and u in waiting]


class Approved:
    """A worker's executor of approved cards, for its agent."""

    def __init__(
        self, executor: Executor, tools: Registry, ctx: Callable[[Run], ToolContext], worker_id: str
    ) -> None:
        self.executor = executor
        self.tools = tools
        self.ctx = ctx
        self.worker_id = worker_id
        # run -> its cards a continuation here claimed to run outside the run's lock
        self._claimed: dict[str, set[str]] = {}
        # approved card -> run: not started, a sibling's tool being served elsewhere (the
        # run is handed over whole once every card is decided): the poll leaves it be
        self.blocked: dict[str, str] = {}

    def unserved(
        self, run: Run, waiting: Mapping[str, str], cards: Mapping[str, Card]
    ) -> Card | None:
        """The first approved, not started card of the run whose tool this worker does
        not serve (another app version proposed it), if any."""
        for use_id in open_calls(run, waiting):
            card = cards[waiting[use_id]]
            if card.status is Status.APPROVED and self.tools.get(card.tool) is None:
                return card
        return None

    def check_served(self, run: Run, waiting: Mapping[str, str], cards: Mapping[str, Card]) -> None:
        """An approved card of a tool this worker does not serve stops the continuation
        before anything runs: :class:`UnknownTool`, the run handed to a worker that serves
        it (``runtime/handover.py``), so that one run's cards are not executed by two
        versions."""
        card = self.unserved(run, waiting, cards)
        if card is not None:
            raise UnknownTool.approved(card.id, card.tool, card.run_id, self.worker_id)

    async def execute(self, run: Run, waiting: Mapping[str, str], cards: dict[str, Card]) -> None:
        """Execute the run's cards that are approved and not started, in the model's
        order (after :meth:`check_served`); ``cards`` (by id) is updated with each as it
        ends up."""
        self.check_served(run, waiting, cards)
        for use_id in open_calls(run, waiting):
            card = cards[waiting[use_id]]
            if card.status is Status.APPROVED:
                cards[card.id] = await self.executor.execute(card, self.ctx(run))

    def claim(self, run: Run, waiting: Mapping[str, str], cards: Mapping[str, Card]) -> list[Card]:
        """The run's approved, not started cards no continuation here runs yet, in the
        model's order, claimed for the caller to run (:meth:`run_claimed`; under the
        run's lock). None while an approved card's tool is not served here (the run is
        handed over whole once every card is decided)."""
        calls = open_calls(run, waiting)
        if self.unserved(run, waiting, cards) is not None:
            for card in (cards[waiting[u]] for u in calls):
                if card.status is Status.APPROVED:
                    self.blocked[card.id] = run.id
            return []
        self.executor.seen_elsewhere(run.id, (cards[waiting[u]] for u in calls))
        held = self._claimed.setdefault(run.id, set())
        out = []
        for use_id in calls:
            card = cards[waiting[use_id]]
            if card.status is Status.APPROVED and card.id not in held:
                held.add(card.id)
                out.append(card)
        if not held:
            del self._claimed[run.id]
        return out

    def apart(self, run: Run, waiting: Mapping[str, str], cards: Mapping[str, Card]) -> bool:
        """With no card pending: whether the approved, not started cards are claimed and
        run each on its own (:meth:`claim`) rather than by the resume, one after the
        other under the run's lock: when there are several ("approve all": one hanging
        would hold the others back), or one beside a card executing elsewhere (its
        previous holder's, settled over a lease and a tool deadline: design note 49). A
        single one alone runs inside the resume (no second read of the run)."""
        if self.unserved(run, waiting, cards) is not None:
            return False
        held = self._claimed.get(run.id, set())
        ids = [waiting[u] for u in open_calls(run, waiting)]
        startable = sum(1 for c in ids if cards[c].status is Status.APPROVED and c not in held)
        executing = any(cards[c].status is Status.EXECUTING for c in ids)
        return startable > 1 or (startable == 1 and executing)

    def busy(self, run_id: str) -> bool:
        """A continuation here is running a claimed card of the run."""
        return run_id in self._claimed

    def busy_runs(self) -> set[str]:
        return set(self._claimed)

    async def run_claimed(self, run: Run, claimed: list[Card], slot: Callable[[], Slot]) -> bool:
        """Execute the claimed cards, each in a task of its own holding a step slot (let
        go of while a provider answers), started in the model's order: one whose
        revalidation or provider call hangs holds none of the others (a hostile probe: a
        batch's refund waited 65 s behind a charge's locked table, and a message sent
        meanwhile invalidated it). The claims end once every one has ended, however.
        False if none of them left `approved` (none could start: the run is no longer
        this worker's). The first error of any is raised once all have ended."""

        async def one(card: Card) -> Card:
            async with slot():
                return await self.executor.execute(card, self.ctx(run))

        try:
            ended = await asyncio.gather(*(one(c) for c in claimed), return_exceptions=True)
        finally:
            held = self._claimed.get(run.id, set())
            held.difference_update(c.id for c in claimed)
            if not held:
                self._claimed.pop(run.id, None)
        for outcome in ended:  # a cancellation a tool let out is an Unavailable (Executor)
            if isinstance(outcome, BaseException):
                raise outcome
        return any(c.status is not Status.APPROVED for c in ended if isinstance(c, Card))
