"""The WhatsApp Cloud API channel: webhook (``webhook``), signature (``signature``),
inbound parsing (``inbound``), the text-confirmation policy (``policy``), the Graph API
sender (``graph``), messages built from the thread log (``outbound``) and the gateway-side
courier that sends them exactly once across gateways (``courier``, design note 24)."""
