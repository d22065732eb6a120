"""Channel adapters of the gateway (WhatsApp Cloud API)."""
