"""`specwire api`: an OpenAI-compatible HTTP endpoint on the user's machine that speculates against the service.

Importing this package is free of side effects and of the ASGI stack: `app.cli` reads the
command's flags from `command`, and the server itself is imported only when it starts.
"""
