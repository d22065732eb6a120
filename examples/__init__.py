"""Example apps built only on signoff's public API (``from signoff import ...``)."""
