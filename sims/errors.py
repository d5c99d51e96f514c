"""Errors that the command line reports as one line with exit status 2."""


class ConfigError(ValueError):
    """A configuration, scenario file or command-line value is invalid; the message names it."""
