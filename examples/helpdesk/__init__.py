"""A small helpdesk on signoff: look up an order, refund one, change a delivery address,
close an account. Written only against the public API (``from signoff import ...``).

Run it from a checkout of the repository (no API key needed: an offline model stands in
for Claude until ``ANTHROPIC_API_KEY`` is set)::

    signoff dev --app examples.helpdesk:app

``app`` is a zero-argument factory: each process builds its own App (and its own
connection pool, in ``setup``).
"""

from __future__ import annotations

from datetime import timedelta

from examples.helpdesk.data import Shop
from examples.helpdesk.model import HelpdeskModel
from examples.helpdesk.tools import TOOLS
from signoff import App, Policy, Registry, Risk, Rule, Verdict

__all__ = ["SYSTEM", "app", "helpdesk_policy"]

SYSTEM = (
    "You are the customer helpdesk of a small online shop, talking with a signed-in "
    "customer about their own orders and account. Look orders up before acting on them. "
    "Refunds, address changes and account closures only propose: the customer confirms "
    "each on a card, and you are told the outcome. Never say something was done before "
    "the tool result says it was executed."
)
REFUND_LIMIT_CENTS = 50_000  # above $500 a human agent decides, not the chat


def helpdesk_policy() -> Policy:
    return Policy(
        [
            Rule(
                Verdict.DENY,
                tool="refund_order",
                when=lambda args: int(args.get("amount_cents", 0)) > REFUND_LIMIT_CENTS,
                reason="refunds above $500 are handled by a human agent",
            ),
            Rule(Verdict.ASK, tool="refund_order"),
            Rule(Verdict.ASK, tool="change_delivery_address"),
            Rule(Verdict.ASK, tool="close_account"),
            # Critical cards (refunds, closing the account) wait five minutes at most.
            Rule(Verdict.ASK, risk=Risk.CRITICAL, ttl=timedelta(minutes=5)),
        ]
    )


def app() -> App:
    """The helpdesk app; ``setup`` connects the shop, which tools get as ``ctx.services``."""
    helpdesk = App(
        name="helpdesk",
        tools=Registry(TOOLS),
        policy=helpdesk_policy(),
        system=SYSTEM,
        offline_model=HelpdeskModel(),
        hint="“where is order A101?” or “refund order A100, it arrived broken”",
    )

    async def setup(database_url: str) -> Shop:
        return await Shop.connect(database_url)

    async def teardown() -> None:
        if isinstance(helpdesk.services, Shop):
            await helpdesk.services.close()

    helpdesk.setup = setup
    helpdesk.teardown = teardown
    return helpdesk
