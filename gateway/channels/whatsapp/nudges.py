"""Touches on a card's WhatsApp message that decide nothing, answered so the person knows:
a reaction (a 👍 on the card was taken for an approval, and dropped without a word), or a
template's quick-reply button (a card sent outside the 24-hour window goes as the
business's template; its buttons, if it has any, carry no decision of ours). A reaction
is told to use the card's buttons; a template button, which opens the window again, gets
the card itself with its buttons. Nothing is decided here, and nothing else is done."""

from __future__ import annotations

from typing import TYPE_CHECKING

from signoff.gateway.channels.whatsapp import inbound, outbound
from signoff.runtime.cards import Status
from signoff.runtime.errors import CardNotFound

if TYPE_CHECKING:
    from signoff.gateway.channels.whatsapp.webhook import WhatsAppChannel


async def answer(channel: WhatsAppChannel, item: inbound.Inbound) -> None:
    """Answer a nudge on one of the number's own cards; anything else is left alone."""
    assert item.nudge is not None and item.quoted is not None
    thread = await channel.rows.contact_thread(channel.tenant, item.wa_id)
    if thread is None:
        return
    card_id = await channel.rows.quoted_card(thread, item.quoted)
    if card_id is None:
        return
    try:
        card = await channel.store.get_card(card_id)
    except CardNotFound:
        return
    if card.owner != item.wa_id:
        return
    await channel.rows.touch_inbound(channel.tenant, item.wa_id)  # the person wrote to us
    if item.nudge == "reaction":
        if card.status is Status.PENDING:
            await channel.reply(item, outbound.REACTION_DECIDES_NOTHING)
    elif card.status is Status.PENDING:
        await channel.reply(item, outbound.card_text(card.public()), card=card.public())
    else:
        await channel.reply(item, outbound.decided_notice(card.public()))
