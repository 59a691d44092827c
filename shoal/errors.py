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


class Diverged(ShoalError):
    """Training diverged: the learner's losses, the policy's weights, or what it computes from a
    finite observation hold NaN or inf. Restarting the runner that noticed cannot help (every
    runner acts with the same weights), so the run fails with this at once."""

    @staticmethod
    def advice(config) -> str:
        """What to try: lower the learning rates the run has (``lr``, and any network's own)."""
        from shoal.config import OWN_LRS

        rates = [f"--{k.replace('_', '-')} (now {getattr(config, k):g})" for k in ("lr", *OWN_LRS)
                 if getattr(config, k, None) is not None]
        return f"lower {' or '.join(rates)}, or scale the env's rewards down"
