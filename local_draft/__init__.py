"""The client side: draft model, sampling, verify client and the speculation loop."""
