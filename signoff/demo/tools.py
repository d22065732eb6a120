"""The payments desk tools: two reads, two reversible writes, two critical writes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import msgspec

from signoff import (
    Prepared,
    ResultField,
    ResultView,
    Revalidation,
    Risk,
    Tool,
    ToolContext,
    ToolValidationError,
    one_line,
)
from signoff.demo.money import br_datetime, brl, mask_cpf, parse_amount
from signoff.demo.provider import Provider

EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _provider(ctx: ToolContext) -> Provider:
    services = ctx.services
    if not isinstance(services, Provider):
        raise ToolValidationError("the payments provider is not configured")
    return services


async def _resolve_customer(ctx: ToolContext, name: str) -> dict[str, Any]:
    matches = await _provider(ctx).find_customers(ctx.tenant, name.strip())
    active = [m for m in matches if m["active"]]
    if not active:
        raise ToolValidationError(
            {"en": f"no customer matches {name!r}", "pt-BR": f"nenhum cliente se chama {name!r}"}
        )
    if len(active) > 1:
        names = ", ".join(m["name"] for m in active)
        raise ToolValidationError(
            {
                "en": f"{name!r} is ambiguous: {names}; ask the user which one",
                "pt-BR": f"{name!r} é ambíguo: {names}; diga qual",
            }
        )
    return active[0]


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


class CustomerQuery(msgspec.Struct, forbid_unknown_fields=True):
    query: str


class PixChargeIn(msgspec.Struct, forbid_unknown_fields=True):
    customer: str
    amount: str | float
    description: str = ""


class RefundIn(msgspec.Struct, forbid_unknown_fields=True):
    sale_id: str
    amount: str | float | None = None


class CancelIn(msgspec.Struct, forbid_unknown_fields=True):
    appointment_id: str


class EmailIn(msgspec.Struct, forbid_unknown_fields=True):
    customer: str
    email: str


class GetBalance(Tool):
    name = "get_balance"
    description = "Current balance of the merchant account, in BRL."
    risk = Risk.READ
    input_type = Empty

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        cents = await _provider(ctx).balance(ctx.tenant)
        return {"balance_cents": cents, "balance": brl(cents)}


class FindCustomer(Tool):
    name = "find_customer"
    description = "Find customers by (part of) their name."
    risk = Risk.READ
    input_type = CustomerQuery

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        found = await _provider(ctx).find_customers(ctx.tenant, str(args["query"]))
        return {
            "customers": [
                {"id": c["id"], "name": c["name"], "cpf": mask_cpf(c["cpf"])} for c in found
            ]
        }


class CreatePixCharge(Tool):
    name = "create_pix_charge"
    description = (
        "Create a Pix charge for a customer. amount is in reais (e.g. '150' or '150,00'). "
        "The user is asked to confirm before anything is created."
    )
    risk = Risk.CRITICAL
    input_type = PixChargeIn
    editable = frozenset({"amount", "description"})
    result_view = ResultView(
        title={"pt-BR": "Cobrança Pix criada", "en": "Pix charge created"},
        fields=(
            ResultField(
                key="amount", label={"pt-BR": "Valor", "en": "Amount"}, format="money_cents"
            ),
            ResultField(
                key="copy_paste",
                label={"pt-BR": "código copia-e-cola", "en": "copy-and-paste code"},
                format="copy",
            ),
        ),
    )

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, PixChargeIn)
        customer = await _resolve_customer(ctx, data.customer)
        cents = parse_amount(data.amount)
        # The model's words: one inert line, the same in the args (what the payer sees)
        # and on the card, and in a labelled row of its own, never inside the summary.
        description = one_line(data.description, 140)
        summary = (
            f"Gerar cobrança Pix · Cliente: {customer['name']} (CPF {mask_cpf(customer['cpf'])})"
            f" · Valor: {brl(cents)}"
        )
        args = {"customer_id": customer["id"], "amount_cents": cents, "description": description}
        impact = {
            "amount_cents": cents,
            "amount": brl(cents),
            "target": customer["name"],
            "reversible": False,
            "side_effects": ["cobrança Pix enviada ao cliente"],
        }
        fields = {"Descrição": description} if description else {}
        return Prepared(args=args, summary=summary, impact=impact, fields=fields)

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        customer = await _provider(ctx).customer(args["customer_id"])
        if customer is None or not customer["active"]:
            return Revalidation.changed(
                {
                    "pt-BR": "o cliente não está mais ativo",
                    "en": "the customer is no longer active",
                },
                {"field": "customer.active", "approved": True, "current": False},
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _provider(ctx).create_charge(
            operation_id,
            ctx.tenant,
            args["customer_id"],
            int(args["amount_cents"]),
            str(args.get("description", "")),
        )


class RefundSale(Tool):
    name = "refund_sale"
    description = "Refund a sale (all of it, or part with amount in reais). Needs confirmation."
    risk = Risk.CRITICAL
    input_type = RefundIn
    editable = frozenset({"amount"})
    result_view = ResultView(
        title={"pt-BR": "Estorno feito", "en": "Refund made"},
        fields=(
            ResultField(
                key="amount", label={"pt-BR": "Valor", "en": "Amount"}, format="money_cents"
            ),
            ResultField(key="refund_id", label={"pt-BR": "Estorno", "en": "Refund"}),
        ),
    )

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, RefundIn)
        provider = _provider(ctx)
        sale = await provider.sale(ctx.tenant, data.sale_id.strip().upper())
        if sale is None:
            raise ToolValidationError(
                {"en": f"no sale {data.sale_id!r}", "pt-BR": f"não há venda {data.sale_id!r}"}
            )
        left = sale["amount"] - sale["refunded"]
        if left <= 0:  # a card of R$ 0,00 would "execute" a refund of nothing
            raise ToolValidationError(
                {
                    "en": f"sale {sale['id']} is already refunded in full",
                    "pt-BR": f"a venda {sale['id']} já foi estornada por inteiro",
                }
            )
        cents = left if data.amount is None else parse_amount(data.amount)
        if cents > left:
            raise ToolValidationError(
                {
                    "en": f"only {brl(left)} of sale {sale['id']} can be refunded",
                    "pt-BR": f"só {brl(left)} da venda {sale['id']} podem ser estornados",
                }
            )
        balance = await provider.balance(ctx.tenant)
        if cents > balance:
            raise ToolValidationError(
                {
                    "en": f"the balance ({brl(balance)}) does not cover {brl(cents)}",
                    "pt-BR": f"o saldo ({brl(balance)}) não cobre {brl(cents)}",
                }
            )
        summary = (
            f"Estornar venda {sale['id']} · Cliente: {sale['name']} (CPF {mask_cpf(sale['cpf'])})"
            f" · Valor: {brl(cents)}"
        )
        args = {
            "sale_id": sale["id"],
            "amount_cents": cents,
            "balance_seen": balance,
            "refundable_seen": left,
        }
        impact = {
            "amount_cents": cents,
            "amount": brl(cents),
            "target": sale["name"],
            "reversible": False,
            "side_effects": ["o dinheiro sai da conta do lojista"],
        }
        return Prepared(args=args, summary=summary, impact=impact)

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        provider = _provider(ctx)
        cents = int(args["amount_cents"])
        sale = await provider.sale(ctx.tenant, str(args["sale_id"]))
        left = 0 if sale is None else sale["amount"] - sale["refunded"]
        if cents > left:  # refunded meanwhile (another card, another channel)
            seen = int(args.get("refundable_seen", cents))
            return Revalidation.changed(
                {
                    "pt-BR": "a venda foi estornada nesse meio-tempo",
                    "en": "the sale was refunded meanwhile",
                },
                {"field": "refundable", "approved": brl(seen), "current": brl(left)},
            )
        balance = await provider.balance(ctx.tenant)
        if balance < cents:
            return Revalidation.changed(
                {
                    "pt-BR": "o saldo não cobre mais o estorno",
                    "en": "the balance no longer covers the refund",
                },
                {
                    "field": "balance",
                    "approved": brl(int(args["balance_seen"])),
                    "current": brl(balance),
                },
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _provider(ctx).refund(
            operation_id, ctx.tenant, str(args["sale_id"]), int(args["amount_cents"])
        )


class CancelAppointment(Tool):
    name = "cancel_appointment"
    description = "Cancel a scheduled appointment by its id (e.g. A001). Needs confirmation."
    risk = Risk.REVERSIBLE
    input_type = CancelIn
    ttl = timedelta(minutes=30)
    result_view = ResultView(
        title={"pt-BR": "Consulta cancelada", "en": "Appointment cancelled"},
        fields=(
            ResultField(key="appointment_id", label={"pt-BR": "Consulta", "en": "Appointment"}),
        ),
    )

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, CancelIn)
        appt = await _provider(ctx).appointment(ctx.tenant, data.appointment_id.strip().upper())
        if appt is None:
            raise ToolValidationError(f"no appointment {data.appointment_id!r}")
        if appt["status"] != "scheduled":
            raise ToolValidationError(f"appointment {appt['id']} is {appt['status']}")
        when = br_datetime(str(appt["at"]))
        summary = f"Cancelar consulta {appt['id']} · Cliente: {appt['name']} · Data: {when}"
        impact = {
            "target": appt["name"],
            "reversible": True,
            "side_effects": ["o horário fica livre"],
        }
        return Prepared(args={"appointment_id": appt["id"]}, summary=summary, impact=impact)

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        appt = await _provider(ctx).appointment(ctx.tenant, args["appointment_id"])
        if appt is None or appt["status"] != "scheduled":
            current = "missing" if appt is None else appt["status"]
            return Revalidation.changed(
                {
                    "pt-BR": "a consulta não está mais agendada",
                    "en": "the appointment is no longer scheduled",
                },
                {"field": "status", "approved": "scheduled", "current": current},
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _provider(ctx).cancel_appointment(ctx.tenant, str(args["appointment_id"]))


class UpdateEmail(Tool):
    name = "update_email"
    description = "Change a customer's e-mail address. Needs confirmation."
    risk = Risk.REVERSIBLE
    input_type = EmailIn
    editable = frozenset({"email"})
    result_view = ResultView(
        title={"pt-BR": "E-mail alterado", "en": "E-mail changed"},
        fields=(ResultField(key="email", label={"pt-BR": "Novo e-mail", "en": "New e-mail"}),),
    )

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, EmailIn)
        email = data.email.strip().lower()
        # A control or format character (a bidi override) has no place in an address.
        if not EMAIL.match(email) or one_line(email, 254) != email:
            raise ToolValidationError(f"{one_line(data.email, 80)!r} is not an e-mail address")
        customer = await _resolve_customer(ctx, data.customer)
        summary = f"Alterar e-mail · Cliente: {customer['name']}"
        impact = {
            "target": customer["name"],
            "reversible": True,
            "side_effects": ["os recibos vão para o novo endereço"],
        }
        args = {"customer_id": customer["id"], "email": email, "previous": customer["email"]}
        fields = {"E-mail atual": str(customer["email"]), "Novo e-mail": email}
        return Prepared(args=args, summary=summary, impact=impact, fields=fields)

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _provider(ctx).update_email(str(args["customer_id"]), str(args["email"]))


ALL_TOOLS: list[Tool] = [
    GetBalance(),
    FindCustomer(),
    CreatePixCharge(),
    RefundSale(),
    CancelAppointment(),
    UpdateEmail(),
]
