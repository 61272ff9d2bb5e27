"""The specwire command line and terminal chat."""
