"""Reading config.json fields with errors that name the field (`config.hidden_size: ...`)."""

from __future__ import annotations

import math
from typing import Any

from estimator.errors import EstimatorInputError

# Upper bounds far beyond any real model: they catch typos and hostile input (10^15 layers).
LIMITS = {
    "hidden_size": 1_000_000,
    "num_hidden_layers": 100_000,
    "vocab_size": 100_000_000,
    "intermediate_size": 10_000_000,
    "num_attention_heads": 100_000,
    "num_key_value_heads": 100_000,
    "head_dim": 100_000,
    "num_experts": 1_000_000,
}
DEFAULT_LIMIT = 100_000_000

_MISSING = object()


class ConfigReader:
    """A config.json object plus the dotted path used in error messages."""

    def __init__(self, data: object, path: str = "config") -> None:
        if not isinstance(data, dict):
            raise EstimatorInputError(path, f"expected a JSON object, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.path = path

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise EstimatorInputError(self.field(key), "required field is missing")
            return int(default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EstimatorInputError(self.field(key), f"expected an integer, got {value!r:.60}")
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise EstimatorInputError(self.field(key), f"expected an integer, got {value!r}")
            value = int(value)
        limit = LIMITS.get(key, DEFAULT_LIMIT)
        if value < minimum:
            raise EstimatorInputError(self.field(key), f"must be >= {minimum}, got {value}")
        if value > limit:
            raise EstimatorInputError(self.field(key), f"{value} is absurdly large (limit {limit})")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise EstimatorInputError(self.field(key), f"expected true or false, got {value!r:.60}")
        return value

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise EstimatorInputError(self.field(key), f"expected a string, got {value!r:.60}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise EstimatorInputError(self.field(key), "expected a list of integers")
        return list(value)

    def str_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise EstimatorInputError(self.field(key), "expected a list of strings")
        return list(value)

    def nested(self, key: str) -> ConfigReader | None:
        value = self.data.get(key)
        if value is None:
            return None
        return ConfigReader(value, self.field(key))
