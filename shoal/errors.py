"""Errors that speak to the user: the CLI prints them as one line, never a traceback."""


class ShoalError(Exception):
    """A user-facing error: what was wrong and what to do about it."""


class ConfigError(ShoalError):
    """An invalid configuration value (raised from a config's ``__post_init__``).

    Deliberately not a ValueError: the CLI parser would catch that and print a multi-line box.
    """


class RoleFailed(ShoalError):
    """A role (an actor on the ray backend) died or its call raised; the run may be restarted
    from its newest checkpoint (``--max-failures``)."""


class SharedObjectLost(RoleFailed):
    """An object other roles depend on (the published weights) was lost with the role that owned
    it. Replacing the role that noticed cannot help: the run restarts from its newest checkpoint."""
