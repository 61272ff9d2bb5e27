"""Target backends: one model, one forward pass over a block, a KV cache that truncates.

The interface is target.py, the factory that picks and loads a backend is factory.py, and
each backend is a module of its own. This file imports nothing: a package whose `__init__`
imports its own modules makes a cycle with every module that imports the package.
"""
