"""Errors the estimator raises for bad input: each names the offending field."""


class EstimatorInputError(ValueError):
    """Bad input (config field, option, size). `field` is a dotted path such as
    `config.num_hidden_layers` or `setup.lora_rank`; front ends map this to exit code 2 / HTTP
    422."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
