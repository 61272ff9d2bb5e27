"""UserError: a problem the user can fix; the CLI prints it as one line and exits with status 2."""


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""
