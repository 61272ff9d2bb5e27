"""`specwire chat`: the interactive terminal chat (Textual), hybrid, remote or offline.

Importing this package is free of side effects and of Textual: `app.cli` reads the chat's
flags from `arguments`, and the app itself is imported only when a chat starts.
"""
