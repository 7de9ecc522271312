"""Request documents: what the CLI builds from its options and what REST clients post."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from estimator.setup import TrainingSetup

MAX_SEQ_LEN = 100_000_000
MAX_SEQ_LENS = 256
# request caps (issue 16): names and ids, GPU options like "8xh100-80gb", top-level keys of a
# config.json (real ones have < 200), dataset sample lengths (a 16 MiB body holds ~2 M anyway)
MAX_NAME_CHARS = 200
MAX_GPU_OPTION_CHARS = 64
MAX_CONFIG_KEYS = 2000
MAX_DATASET_LENGTHS = 10_000_000


class ModelInput(BaseModel):
    """Exactly one of `config` (a Hugging Face config.json object), `preset` (a name from
    `/v1/models`) or `params` (a params-only spec, optionally with geometry)."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] | None = Field(None, max_length=MAX_CONFIG_KEYS)
    preset: str | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)
    hub: str | None = Field(None, min_length=1, max_length=300)  # ORG/NAME[@rev] (estimator.hub)
    params: float | None = Field(None, ge=1, le=1e15)
    hidden: int | None = Field(None, ge=1, le=10**7)
    layers: int | None = Field(None, ge=1, le=10**6)
    vocab: int | None = Field(None, ge=1, le=10**9)
    intermediate: int | None = Field(None, ge=1, le=10**8)
    name: str | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelInput:
        given = [k for k in ("config", "preset", "hub", "params") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'config', 'preset', 'hub' or 'params'")
        return self


class CalibrationInput(BaseModel):
    """A measured step for one configuration (e.g. from a memtest): the efficiency that
    reproduces it re-prices every option; the measured cell is marked `measured`."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(min_length=1, max_length=MAX_GPU_OPTION_CHARS)
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    batch: int = Field(1, ge=1, le=1_000_000)
    step_seconds: float | None = Field(None, gt=0, le=1e7)
    tokens_per_second: float | None = Field(None, gt=0, le=1e12)

    @model_validator(mode="after")
    def _one_measurement(self) -> CalibrationInput:
        if (self.step_seconds is None) == (self.tokens_per_second is None):
            raise ValueError("give exactly one of step_seconds or tokens_per_second")
        return self


class TrainConfigInput(BaseModel):
    """A training config sent with a request: an axolotl / LLaMA-Factory / torchtune / TRL-HF /
    DeepSpeed / accelerate file's text, or a PEFT adapter_config.json's. Its values fill what the
    request does not state."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=256 * 1024)
    format: str | None = Field(
        None,
        max_length=32,
        description="axolotl, llamafactory, torchtune, trl (= hf), deepspeed, accelerate, "
        "peft (an adapter_config.json), json or yaml; detected when absent",
    )


class _WithTrainConfig(BaseModel):
    """Requests that take `train_config`: it is merged into the body before validation and its
    report (what was read, what was ignored and why) is kept for the document."""

    train_config: TrainConfigInput | None = None
    _train_config_report: dict[str, Any] | None = PrivateAttr(None)

    @model_validator(mode="wrap")
    @classmethod
    def _merge_train_config(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not isinstance(data, dict) or data.get("train_config") is None:
            return handler(data)  # no config to read: estimator.train_config is not loaded
        from estimator.errors import EstimatorInputError
        from estimator.train_config.body import merge_train_config

        try:
            merged, report = merge_train_config(data)
        except EstimatorInputError as err:
            raise PydanticCustomError(
                "train_config", "{field}: {message}", {"field": err.field, "message": err.message}
            ) from None
        model = handler(merged)
        model._train_config_report = report
        return model

    @property
    def train_config_report(self) -> dict[str, Any] | None:
        private = self.__pydantic_private__  # a slot: pydantic's __getattr__ is ~2 us
        return None if private is None else private.get("_train_config_report")


class EstimateRequest(_WithTrainConfig):
    """`POST /v1/estimate` body; `trainfit estimate` builds the same from its options."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": {"preset": "qwen3.5-27b"},
                    "setup": {
                        "method": "lora",
                        "lora_rank": 16,
                        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
                        "optimizer": "adamw-8bit",
                        "checkpointing": "offload",
                        "loss": "chunked",
                        "batch": 1,
                    },
                    "seq_lens": [16000, 32000, 48000],
                    "gpus": ["a100-80gb", "rtx-pro-6000", "h200", "2xh200"],
                    "usable_fraction": 0.92,
                    "profile": "default",
                }
            ]
        },
    )

    model: ModelInput
    setup: TrainingSetup = Field(default_factory=TrainingSetup)
    seq_lens: list[int] = Field(
        default_factory=lambda: [4096], min_length=1, max_length=MAX_SEQ_LENS
    )
    gpus: list[str] = Field(default_factory=lambda: ["h100-80gb"], min_length=1, max_length=64)
    usable_fraction: float = Field(0.92, gt=0, le=1)
    profile: str = Field("default", min_length=1, max_length=MAX_NAME_CHARS)
    tokens: float | None = Field(None, gt=0, le=1e16)
    target_tokens: Literal["chinchilla"] | None = None
    dataset_lengths: list[int] | None = Field(None, min_length=1, max_length=MAX_DATASET_LENGTHS)
    epochs: float = Field(1.0, gt=0, le=1e6)
    overflow: Literal["drop", "truncate"] = "drop"
    prices: dict[str, float] = Field(default_factory=dict, max_length=64)
    calibration: CalibrationInput | None = None

    @model_validator(mode="after")
    def _seq_lens_in_range(self) -> EstimateRequest:
        for s in self.seq_lens:
            if not 1 <= s <= MAX_SEQ_LEN:
                raise ValueError(f"seq_lens: {s} is outside 1..{MAX_SEQ_LEN}")
        for gpu, price in self.prices.items():
            if not 0 <= price <= 10_000:
                raise ValueError(f"prices.{gpu}: {price} USD/h is outside 0..10000")
        return self


class CheckRequest(_WithTrainConfig):
    """`POST /v1/check` body: as the estimate request but one GPU (may be `2xh200`)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelInput
    setup: TrainingSetup = Field(default_factory=TrainingSetup)
    seq_lens: list[int] = Field(min_length=1, max_length=MAX_SEQ_LENS)
    gpu: str = Field(min_length=1, max_length=MAX_GPU_OPTION_CHARS)
    usable_fraction: float = Field(0.92, gt=0, le=1)
    profile: str = Field("default", min_length=1, max_length=MAX_NAME_CHARS)

    def as_estimate_request(self) -> EstimateRequest:
        req = EstimateRequest(
            model=self.model,
            setup=self.setup,
            seq_lens=self.seq_lens,
            gpus=[self.gpu],
            usable_fraction=self.usable_fraction,
            profile=self.profile,
        )
        req._train_config_report = self._train_config_report
        return req


class SolverRequest(BaseModel):
    """`POST /v1/max-seq`, `/v1/max-batch`, `/v1/min-gpus`: one GPU option; `seq_len` is the
    length for max-batch and min-gpus."""

    model_config = ConfigDict(extra="forbid")

    model: ModelInput
    setup: TrainingSetup = Field(default_factory=TrainingSetup)
    gpu: str = Field(min_length=1, max_length=MAX_GPU_OPTION_CHARS)
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)
    granularity: int = Field(256, ge=1, le=1_000_000)
    usable_fraction: float = Field(0.92, gt=0, le=1)
    profile: str = Field("default", min_length=1, max_length=MAX_NAME_CHARS)
    # min-gpus with layout search: the run's tokens and prices price each layout
    tokens: float | None = Field(None, gt=0, le=1e16)
    prices: dict[str, float] = Field(default_factory=dict, max_length=64)
    within_days: float | None = Field(None, gt=0, le=1e5)


class RecommendRequest(BaseModel):
    """`POST /v1/recommend`: the best fitting setting per GPU for the length the data needs
    (`seq_len`, or the longest sample of `dataset_lengths`), cheapest first."""

    model_config = ConfigDict(extra="forbid")

    model: ModelInput
    setup: TrainingSetup = Field(default_factory=TrainingSetup)
    gpus: list[str] = Field(min_length=1, max_length=64)
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)
    dataset_lengths: list[int] | None = Field(None, min_length=1, max_length=MAX_DATASET_LENGTHS)
    tokens: float | None = Field(None, gt=0, le=1e16)
    epochs: float = Field(1.0, gt=0, le=1e6)
    overflow: Literal["drop", "truncate"] = "drop"
    prices: dict[str, float] = Field(default_factory=dict, max_length=64)
    usable_fraction: float = Field(0.92, gt=0, le=1)
    profile: str = Field("default", min_length=1, max_length=MAX_NAME_CHARS)
