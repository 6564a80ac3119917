"""The tabs: one module per tab (a short render(ctx) plus on_* handlers) and what only that tab uses; imports parts/ and the service."""
