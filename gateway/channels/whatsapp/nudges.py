"""Messages about a card that decide nothing, answered so the person knows. A bare "sim"
that cannot approve (``ask``: two cards were waiting, the card's risk needs its button,
the card it quotes waits no more, it quotes a notice or a text). And touches on a card's
WhatsApp message: a reaction (a 👍 on the card was taken for an approval, and dropped
without a word), or a template's quick-reply button (a card sent outside the 24-hour window goes as the
business's template; its buttons, if it has any, carry no decision of ours). A reaction
is told to use the card's buttons; a template button, which opens the window again, gets
the card itself with its buttons. Nothing is decided here, and nothing else is done."""

from __future__ import annotations

from typing import TYPE_CHECKING

from signoff.gateway.channels.whatsapp import inbound, outbound
from signoff.runtime.cards import Status
from signoff.runtime.errors import CardNotFound

# Why a "sim" was answered instead of approving (after ``ask:`` in deliveries.effect).
SEVERAL, RISK, GONE, QUOTE = "several", "risk", "gone:", "quote"

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


async def ask(channel: WhatsAppChannel, item: inbound.Inbound, why: str) -> None:
    """Tell the person how to decide, instead of taking a "yes" for a message that would
    supersede the cards it was about."""
    if why.startswith((GONE, RISK)):
        card_id = why.removeprefix(GONE) if why.startswith(GONE) else why.removeprefix(RISK + ":")
        try:
            card = await channel.store.get_card(card_id)
        except CardNotFound:
            return
        said = outbound.decided_notice if why.startswith(GONE) else outbound.needs_button
        await channel.reply(item, said(card.public()))
    elif why == QUOTE:
        await channel.reply(item, outbound.USE_THE_BUTTONS)
    else:
        await channel.reply(item, outbound.SEVERAL_WAITING)
