"""The chat's widgets: small, each with one job; the chat screen coordinates them."""
