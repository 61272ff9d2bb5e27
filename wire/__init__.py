"""What the client and the service share: the wire protocol and the definition of sampling.

Both ends import this package and nothing of each other: the client installs and starts
without the service's code, and the two sides cannot drift on what a message or a
sampling parameter means.
"""
