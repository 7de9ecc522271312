"""The `hf` stack's chunked loss: TRL's `SFTTrainer`, whose fused LM head never builds the logits.

TRL 1.16's SFTTrainer patches the model's forward (`add_fused_lm_head`, trl/trainer/utils.py) and
calls it with `fused_lm_head=True`: per-token log-probabilities from `ChunkedLogProbFunction`
(trl/kernels/chunked_logprob.py), one (4096 x 32768) tile of the head's projection at a time. The
probe runs that trainer unchanged; off CUDA it substitutes what CUDA runs instead of TRL's
fallbacks, so the CPU and the fake trace allocate what the GPU does (`SUBSTITUTED`):
  - the Triton kernels that fold each tile into per-position statistics (forward and backward):
    they write into buffers TRL allocated and allocate nothing; here they do nothing;
  - CUDA's `addmm(out_dtype=float32, out=acc)` accumulation (in place) for the fallback
    `acc.addmm_(a.float(), b.float())`, whose fp32 copies of the tile and the weight tile exist
    only off CUDA;
  - the compact path (`hidden_states[mask]`, the positions with a label) CUDA takes.
Under fake tensors three data-dependent reads get the answers the probe's rows give (every row is
real tokens, every position has a label): a boolean mask selects every position, `.item()` of a
metric reads 0 (True for a boolean), and transformers' causal-mask skip, which it refuses to take
while tracing, reads the all-ones attention mask as a real run does.

DPO runs the installed TRL's `DPOTrainer` (`dpo_trainer`): 1.16's through the same fused head,
TRL 1.0-1.9's from the full logits (`--loss full`, no fused head to substitute: `cuda_paths` is
entered for the fused head only). ORPO and SimPO run TRL 1.0-1.9's `ORPOTrainer` and
`CPOTrainer` (`orpo_trainer`), from the full logits too.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from probe.hf_stack import arguments_class

__all__ = [
    "SUBSTITUTED",
    "FAKE_SUBSTITUTED",
    "AllRowsValid",
    "cuda_paths",
    "enter_all_rows_valid",
    "fake_masks_read_as_real",
    "dpo_trainer",
    "fused_head_available",
    "kto_trainer",
    "orpo_trainer",
    "sft_trainer",
    "trl_version",
]

SUBSTITUTED = (
    "TRL's fused LM head: its Triton tile kernels (which allocate nothing) do nothing, CUDA's "
    "in-place fp32 addmm replaces the off-CUDA fallback's fp32 copies, and the CUDA path "
    "scores only the positions with a label (hidden_states[mask])"
)
FAKE_SUBSTITUTED = (
    "fake: boolean-mask selections keep every position, a metric's .item() reads 0, and "
    "transformers' causal-mask skip reads the all-ones attention mask (the probe's rows are "
    "unpadded), as a real run does"
)


def trl_version() -> str | None:
    try:
        import trl
    except ImportError:
        return None
    return str(trl.__version__)


def fused_head_available() -> bool:
    """Whether the installed TRL has the fused LM head (`add_fused_lm_head`, TRL 1.10 on): its
    DPOTrainer runs it (the hf stack's `chunked` loss); TRL 1.0-1.9's makes the full logits
    (`full`, trl v1.8.0 trainer/dpo_trainer.py:1289-1296)."""
    try:
        import trl.trainer.utils as utils
    except ImportError:
        return False
    return hasattr(utils, "add_fused_lm_head")


class _NoKernel:
    """A Triton kernel launched as `kernel[grid](...)` that does nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def cuda_paths() -> Iterator[None]:
    """TRL's CUDA paths of the fused LM head on a non-CUDA device (module docstring)."""
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as utils

    replacements: dict[Any, dict[str, Any]] = {
        kernels: {
            "_use_triton": lambda device: True,
            "_forward_kernel": _NoKernel(),
            "_backward_kernel": _NoKernel(),
            "_addmm_fp32": lambda acc, a, b: None,
            "triton": types.SimpleNamespace(cdiv=lambda a, b: -(-a // b)),
        },
        utils: {"_use_triton": lambda device: True},
    }
    saved = {
        module: {name: getattr(module, name, None) for name in names}
        for module, names in replacements.items()
    }
    for module, names in replacements.items():
        for name, value in names.items():
            setattr(module, name, value)
    try:
        yield
    finally:
        for module, names in saved.items():
            for name, value in names.items():
                setattr(module, name, value)


def _numel(shape: Any) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


class AllRowsValid(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Under fake tensors: the data-dependent reads of TRL's step, answered as for unpadded
    rows whose every position has a label (module docstring). Enter it inside the fake mode."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, FakeTensor):
            if func is torch.ops.aten.index.Tensor:
                index = args[1]
                if len(index) == 1 and index[0] is not None and index[0].dtype == torch.bool:
                    mask = index[0]
                    shape = (_numel(mask.shape), *first.shape[mask.dim() :])
                    return torch.empty(shape, dtype=first.dtype, device=first.device)
            if func is torch.ops.aten.nonzero.default:
                shape = (_numel(first.shape), first.dim())
                return torch.empty(shape, dtype=torch.int64, device=first.device)
            if func is torch.ops.aten.masked_select.default:
                shape = torch.broadcast_shapes(first.shape, args[1].shape)  # type: ignore[no-untyped-call]
                count = _numel(shape)
                return torch.empty((count,), dtype=first.dtype, device=first.device)
            if func is torch.ops.aten._local_scalar_dense.default:
                if first.dtype == torch.bool:
                    return True
                return 0.0 if first.dtype.is_floating_point else 0
        return func(*args, **kwargs)


def enter_all_rows_valid() -> AllRowsValid:
    """An `AllRowsValid` mode, entered (inside the caller's fake mode and tracker)."""
    mode = AllRowsValid()
    mode.__enter__()  # type: ignore[no-untyped-call]
    return mode


@contextlib.contextmanager
def fake_masks_read_as_real() -> Iterator[None]:
    """transformers' `_ignore_causal_mask_sdpa` refuses to read a fake attention mask
    (`is_tracing`), so it would build the (b, 1, s, s) mask a real unpadded run skips; here it
    reads it (`AllRowsValid` answers `all()`)."""
    import transformers.masking_utils as masking
    from torch._subclasses.fake_tensor import FakeTensor

    original = getattr(masking, "is_tracing")  # noqa: B009 - not an exported name

    def is_tracing(tensor: Any = None) -> bool:
        return bool(original(None if isinstance(tensor, FakeTensor) else tensor))

    setattr(masking, "is_tracing", is_tracing)  # noqa: B010
    try:
        yield
    finally:
        setattr(masking, "is_tracing", original)  # noqa: B010


def _tokenizer(vocab: int) -> Any:
    """A word-level tokenizer over the model's ids (`t0` pads, `t1` ends a row), words split at
    spaces: SFTTrainer needs one (the probe's rows are already ids), the preference trainers
    tokenize the rows' text (`_preference_rows`); nothing is downloaded. The special tokens
    match whole words only: matched anywhere, `t1` would split every `t1...` word in two (the
    rest read as unknown), lengthening the rows past `seq`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()

    def special(word: str) -> Any:
        return AddedToken(word, single_word=True, special=True)

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        pad_token=special("t0"),
        eos_token=special("t1"),
        unk_token=special("t0"),
    )


def _restore_forward(model: Any) -> None:
    """Undo what an earlier length's trainer did to the model, as a user's one-trainer run
    finds it: SFTTrainer's fused forward (on the base model under peft) and accelerate's
    autocast wrapper are instance attributes over the class's `forward`, and accelerate marks
    the model prepared (`_is_accelerate_prepared`, accelerate 1.16.0 accelerator.py:1773), so
    the next trainer's accelerator did not wrap the next fused forward in autocast: the second
    length ran the head outside autocast (an fp32 tile, full fine-tuning, -35 % in the grid)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in {id(model): model, id(base): base}.values():
        for name in ("forward", "_original_forward", "_is_accelerate_prepared"):
            module.__dict__.pop(name, None)


def _trainer(
    cls: Any,
    model: Any,
    args: Any,
    rows: dict[str, list[Any]],
    vocab: int,
    callback: Any,
    **extra: Any,
) -> Any:
    """`cls(model=model, args=args, train_dataset=rows, ...)` with the probe's tokenizer and
    the callback that measures each step."""
    import datasets

    return cls(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict(rows),
        processing_class=_tokenizer(vocab),
        callbacks=[callback],
        **extra,
    )


def sft_trainer(
    model: Any,
    arguments: dict[str, Any],
    fake: bool,
    vocab: int,
    seq: int,
    rows: int,
    callback: Any,
) -> Any:
    """`SFTTrainer(model, SFTConfig(**arguments), ...)` on `rows` random rows of `seq` ids,
    truncated at `seq` (SFTConfig's `max_length` defaults to 1024)."""
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    _restore_forward(model)
    args = arguments_class(SFTConfig, fake)(**arguments, max_length=seq, packing=False)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (rows, seq), generator=generator).tolist()
    return _trainer(SFTTrainer, model, args, {"input_ids": ids}, vocab, callback)


def _words(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def _preference_rows(vocab: int, seq: int, rows: int) -> dict[str, list[str]]:
    """`rows` preference rows of `seq` tokens each way: a one-token prompt, a chosen and a
    rejected completion of the rest, each ending with the end token (DPOTrainer adds it when
    missing, trl 1.16.0 dpo_trainer.py:1063-1068). Chosen and rejected are the same length, so
    the collator pads neither: the fake trace's all-valid masks are the real run's (module
    docstring), and the estimate to compare is `padded_batches: false`. The prompt is one token
    because DPOTrainer labels the completions only (:1298): the fake trace's mask selections keep
    every position, what a real run keeps when every position but the first has a label (the
    estimator's count, an upper bound for longer prompts)."""
    prompt_len = 1
    completion = seq - prompt_len
    generator = torch.Generator().manual_seed(0)

    def draw(n: int) -> list[list[int]]:
        ids: list[list[int]] = torch.randint(2, vocab, (rows, n), generator=generator).tolist()
        return ids

    prompts = draw(prompt_len)
    chosen, rejected = draw(completion - 1), draw(completion - 1)
    return {
        "prompt": [_words(p) for p in prompts],
        # a leading space: DPOTrainer tokenizes prompt + completion as one string (:1098-1108)
        "chosen": [" " + _words([*c, 1]) for c in chosen],
        "rejected": [" " + _words([*r, 1]) for r in rejected],
    }


def _models_as_found(model: Any, ref_model: Any) -> None:
    """The policy (and a reference model) as a user's one-trainer run finds them: the forwards
    an earlier length's trainer patched restored (`_restore_forward`; DPOTrainer patches the
    reference's too, trl 1.16.0 dpo_trainer.py:961-962), and the frozen "ref" copy of the
    adapter that DPOTrainer and KTOTrainer add to a PeftModel (trl 1.16.0
    dpo_trainer.py:667-694, v1.8.0 :648-669; v1.8.0 kto_trainer.py:696-716) deleted."""
    _restore_forward(model)
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
    if ref_model is not None:
        _restore_forward(ref_model)


def dpo_trainer(
    model: Any,
    arguments: dict[str, Any],
    fake: bool,
    vocab: int,
    seq: int,
    rows: int,
    callback: Any,
    ref_model: Any = None,
) -> Any:
    """`DPOTrainer(model, ref_model, args=DPOConfig(**arguments), ...)` on `rows` preference
    rows (`_preference_rows`) of `seq` tokens each way: under peft the reference is the policy
    with its adapters disabled (`ref_model` None; trl 1.16.0 dpo_trainer.py:908-914,
    1328-1336), under full fine-tuning `ref_model`, the model DPOTrainer would load by name
    (probe.hf_stack.build_hf_reference)."""
    from trl import DPOConfig, DPOTrainer  # type: ignore[attr-defined]

    _models_as_found(model, ref_model)
    args = arguments_class(DPOConfig, fake)(**arguments, max_length=seq)
    rows_of = _preference_rows(vocab, seq, rows)
    return _trainer(DPOTrainer, model, args, rows_of, vocab, callback, ref_model=ref_model)


def orpo_trainer(
    model: Any,
    arguments: dict[str, Any],
    fake: bool,
    vocab: int,
    seq: int,
    rows: int,
    callback: Any,
    objective: str = "orpo",
) -> Any:
    """`ORPOTrainer(model, args=ORPOConfig(**arguments), ...)` under `objective` orpo,
    `CPOTrainer(model, args=CPOConfig(**arguments), ...)` under cpo (its defaults: loss_type
    sigmoid, cpo_alpha 1.0), and under simpo `CPOConfig(loss_type="simpo", cpo_alpha=0.0)`
    (SimPO as TRL's docs configure it, docs/source/cpo_trainer.md:83: no NLL term), on `rows`
    preference rows (`_preference_rows`) of `seq` tokens each way: TRL 1.0-1.9's
    trl/experimental/orpo and trl/experimental/cpo, as axolotl 067b021c runs `rl: orpo` and
    `rl: simpo` (core/builders/rl.py:75-80, 135-145). Neither keeps a reference model. The rows'
    prompt is one token and no BOS token exists, so each sequence is `seq` tokens
    (orpo_trainer.py tokenize_row: `add_bos_token_if_needed` adds none, the rows end with the
    end token: no truncation at `max_length` = `seq`)."""
    import importlib

    from probe.stacks import PREFERENCE_TRAINERS

    prefix = PREFERENCE_TRAINERS[objective].removesuffix("Trainer")
    module = importlib.import_module(f"trl.experimental.{prefix.lower()}")
    extra: dict[str, Any] = {"loss_type": "simpo", "cpo_alpha": 0.0} if objective == "simpo" else {}
    _restore_forward(model)
    args = arguments_class(getattr(module, f"{prefix}Config"), fake)(
        **arguments, **extra, max_length=seq
    )
    trainer = getattr(module, f"{prefix}Trainer")
    return _trainer(trainer, model, args, _preference_rows(vocab, seq, rows), vocab, callback)


def _unpaired_rows(vocab: int, seq: int, rows: int) -> dict[str, list[Any]]:
    """`rows` unpaired preference rows of `seq` tokens, a one-token prompt and a completion of
    the rest ending with the end token (KTOTrainer adds it when missing, trl v1.8.0
    trainer/kto_trainer.py:1066-1070), labelled desirable and undesirable in turn, so every
    micro-batch of two or more holds both; every completion is the same length, so the
    collator pads nothing, and the KL rows (each prompt with another row's completion,
    :1114-1118) are `seq` tokens too."""
    pairs = _preference_rows(vocab, seq, rows)
    return {
        "prompt": pairs["prompt"],
        "completion": pairs["chosen"],
        "label": [i % 2 == 0 for i in range(rows)],
    }


def kto_trainer(
    model: Any,
    arguments: dict[str, Any],
    fake: bool,
    vocab: int,
    seq: int,
    rows: int,
    callback: Any,
    ref_model: Any = None,
) -> Any:
    """`KTOTrainer(model, ref_model, args=KTOConfig(**arguments), ...)` of TRL 1.0-1.9 (trl
    v1.8.0 trl/trainer/kto_trainer.py; axolotl 067b021c runs it for `rl: kto`,
    core/builders/rl.py:77-78) on `rows` unpaired rows (`_unpaired_rows`) of `seq` tokens:
    under peft the reference is the policy with its adapters disabled (`ref_model` None), under
    full fine-tuning `ref_model` (probe.hf_stack.build_hf_reference)."""
    import trl

    _models_as_found(model, ref_model)
    config, trainer = getattr(trl, "KTOConfig"), getattr(trl, "KTOTrainer")  # noqa: B009
    args = arguments_class(config, fake)(**arguments, max_length=seq)
    rows_of = _unpaired_rows(vocab, seq, rows)
    return _trainer(trainer, model, args, rows_of, vocab, callback, ref_model=ref_model)
