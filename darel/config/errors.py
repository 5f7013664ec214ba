"""The one error of the parameter layer."""


class ConfigError(ValueError):
    """A parameter value that the workflow refuses to run with."""
