"""A parked run's approved cards run on their approval (design note 60).

A step that proposed several cards waits for every one of them before the model is
told anything; but an approved card does not wait for its siblings to be executed: the
person who clicked "approve" sees it run, as a card alone in its run does. Its outcome
is kept on the card, where the model is told it from once every card is decided; and a
new message that supersedes the run meanwhile no longer throws the approval away (only
a card still ``approved``, not started, is invalidated then: design note 17)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import UnknownTool
from signoff.runtime.execution import Executor
from signoff.runtime.records import Run
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

    async def execute(
        self, run: Run, waiting: Mapping[str, str], cards: dict[str, Card], *, early: bool = False
    ) -> list[str]:
        """Execute the run's cards that are approved and not started, in the model's
        order (after :meth:`check_served`); ``cards`` (by id) is updated with each as it
        ends up. The ids of those executed.

        ``early``: some card of the run is still pending. Then an approved card whose tool
        this worker does not serve makes this run nothing (no :class:`UnknownTool`): the
        run stays parked here, and is handed over whole once every card is decided."""
        if early and self.unserved(run, waiting, cards) is not None:
            return []
        self.check_served(run, waiting, cards)
        done = []
        for use_id in open_calls(run, waiting):
            card = cards[waiting[use_id]]
            if card.status is Status.APPROVED:
                cards[card.id] = await self.executor.execute(card, self.ctx(run))
                done.append(card.id)
        return done
