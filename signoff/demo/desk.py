"""The payments desk demo app: tools + policy + the demo provider."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from signoff import App, Policy, Registry, Rule, Verdict
from signoff.demo.offline_model import OfflineDemoModel
from signoff.demo.provider import Provider
from signoff.demo.tools import ALL_TOOLS

PIX_LIMIT_CENTS = 1_000_000  # R$ 10.000,00: above this the agent may not even ask

SYSTEM = (
    "You are the assistant of a small Brazilian merchant's payments desk. Answer in the user's "
    "language. Read tools run at once. Write tools (Pix charges, refunds, cancellations, e-mail "
    "changes) only propose: the system shows the user a confirmation card and tells you the "
    "outcome. You cannot approve anything; never claim something was done before the tool "
    "result says it was executed."
)


def demo_policy(card_ttl: timedelta | None = None) -> Policy:
    """The demo's rules. ``card_ttl``: every card's lifetime (None: each tool's own)."""
    return Policy(
        [
            Rule(
                Verdict.DENY,
                tool="create_pix_charge",
                when=lambda a: int(a.get("amount_cents", 0)) > PIX_LIMIT_CENTS,
                reason={
                    "pt-BR": "a política não permite cobranças Pix acima de R$ 10.000,00 pelo chat",
                    "en": "Pix charges above R$ 10.000,00 are not allowed from chat",
                },
            ),
            Rule(Verdict.ASK, tool="create_pix_charge", ttl=card_ttl),
            Rule(Verdict.ASK, tool="refund_sale", ttl=card_ttl),
            Rule(Verdict.ASK, tool="cancel_appointment", ttl=card_ttl),
            Rule(Verdict.ASK, tool="update_email", ttl=card_ttl),
        ]
    )


@dataclass
class _Holder:
    provider: Provider | None = None


def build(tenants: tuple[str, ...] = ("demo",), card_ttl: timedelta | None = None) -> App:
    """The demo app. ``setup`` connects the provider and seeds each tenant."""
    holder = _Holder()
    app = App(
        name="payments",
        tools=Registry(ALL_TOOLS),
        policy=demo_policy(card_ttl),
        system=SYSTEM,
        offline_model=OfflineDemoModel(),
        hint={"en": "“charge João 150” or “balance”", "pt-BR": "“cobre 150 do João” ou “saldo”"},
    )

    async def setup(database_url: str) -> Provider:
        holder.provider = await Provider.connect(database_url)
        for tenant in tenants:
            await holder.provider.seed(tenant)
        app.services = holder.provider
        return holder.provider

    async def teardown() -> None:
        if holder.provider is not None:
            await holder.provider.close()

    app.setup = setup
    app.teardown = teardown
    return app
