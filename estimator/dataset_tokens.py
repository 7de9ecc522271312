"""Token counts of a real dataset: each sample's length with the run's tokenizer.

`--dataset data.jsonl|.json|.parquet|.csv --tokenizer tokenizer.json|DIR|HUB_ID
[--text-field text | --messages-field messages --chat-template FILE|from-tokenizer]`

What is counted is what TRL's `SFTTrainer` feeds the model (trl f2cd5771,
trl/trainer/sft_trainer.py):
- a text sample: the text plus the EOS token when it does not end with it (lines 1439-1448,
  `add_eos`), encoded with the tokenizer's special tokens (its post-processor: BOS for Llama);
  the EOS is known only when a tokenizer_config.json sits beside tokenizer.json (or on the Hub);
- a conversation: the chat template rendered over the messages (no generation prompt), encoded
  without special tokens, as `apply_chat_template(tokenize=True)` does (transformers 5.24.0
  tokenization_utils_base.py, `add_special_tokens=False`; the template writes BOS itself).
The template is rendered like transformers' `_compile_jinja_template`
(utils/chat_template_utils.py lines 662-669): jinja2 ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, `tojson`, `raise_exception`, `strftime_now`; the
`{% generation %}` block renders its body.

Files are read with pyarrow in record batches (JSON lines and CSV streamed; parquet by row
group; a .json file holds a list of objects, or JSON lines as `datasets`' `to_json` writes
them), encoded with `tokenizers` in batches (`Tokenizer.encode_batch_fast`, Rust,
multi-threaded). Lengths are cached by content: the key is
the SHA-256 of the dataset file, of tokenizer.json, of the chat template and of the options, in
`$TRAINFIT_CACHE_DIR` (default `~/.cache/trainfit`)/dataset_tokens/<key>.npy. pyarrow, tokenizers,
jinja2 and tqdm are imported only when used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from estimator.errors import EstimatorInputError

FIELD = "dataset"
CACHE_VERSION = "1"
BATCH_ROWS = 2048
PROGRESS_BYTES = 32 * 2**20  # a bar for files larger than this
SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
FROM_TOKENIZER = "from-tokenizer"


@dataclass(frozen=True)
class CountRequest:
    dataset: Path
    tokenizer: str
    text_field: str = "text"
    messages_field: str | None = None
    chat_template: str | None = None  # a file, or "from-tokenizer"


@dataclass
class CountResult:
    lengths: list[int]
    skipped: int  # rows without a value in the field
    cached: bool
    cache_file: str | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: Path
    config: dict[str, Any]  # tokenizer_config.json beside it ({} when absent)
    template_file: Path | None  # chat_template.jinja beside it


def default_cache_dir() -> Path:
    root = os.environ.get("TRAINFIT_CACHE_DIR") or str(Path.home() / ".cache" / "trainfit")
    return Path(root) / "dataset_tokens"


# -- tokenizer and chat template -------------------------------------------------------------------


def find_tokenizer(ref: str) -> TokenizerFiles:
    """tokenizer.json (a file, a directory holding it, or a Hub id through estimator.hub)."""
    path = Path(ref)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        return _beside(path)
    if path.suffix == ".json":
        raise EstimatorInputError("tokenizer", f"no such file {ref!r}")
    from estimator.hub import HubSettings, hub_download, parse_hub_id

    hub = parse_hub_id(ref, "tokenizer")
    settings = HubSettings.from_env()
    tok = hub_download(hub, "tokenizer.json", settings, "tokenizer")
    for extra in ("tokenizer_config.json", "chat_template.jinja"):
        with contextlib.suppress(EstimatorInputError):  # optional files
            hub_download(hub, extra, settings, "tokenizer")
    return _beside(tok)


def _beside(tokenizer_json: Path) -> TokenizerFiles:
    folder = tokenizer_json.parent
    config: dict[str, Any] = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            loaded = json.loads(cfg.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise EstimatorInputError("tokenizer", f"{cfg} is not valid JSON ({err})") from None
        config = loaded if isinstance(loaded, dict) else {}
    template = folder / "chat_template.jinja"
    return TokenizerFiles(tokenizer_json, config, template if template.is_file() else None)


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def chat_template(option: str, tok: TokenizerFiles) -> str:
    """The template text: a .jinja file, a JSON file with `chat_template`, or the tokenizer's."""
    if option == FROM_TOKENIZER:
        if tok.template_file is not None:
            return tok.template_file.read_text(encoding="utf-8")
        found = _template_from_config(tok.config)
        if found is None:
            raise EstimatorInputError(
                "chat_template",
                f"no chat template beside {tok.tokenizer_json} (chat_template.jinja or "
                f"tokenizer_config.json `chat_template`); give --chat-template FILE",
            )
        return found
    path = Path(option)
    if not path.is_file():
        raise EstimatorInputError("chat_template", f"no such file {option!r}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        found = _template_from_config(json.loads(text))
        if found is None:
            raise EstimatorInputError("chat_template", f"{path} has no `chat_template` key")
        return found
    return text


def _template_from_config(config: object) -> str | None:
    if not isinstance(config, dict):
        return None
    value = config.get("chat_template")
    if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def template_renderer(template: str, tok: TokenizerFiles) -> Callable[[list[Any]], str]:
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise EstimatorInputError("chat_template", "chat templates need jinja2") from None

    class Generation(Extension):  # `{% generation %}...{% endgeneration %}`: render the body
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def strftime_now(fmt: str) -> str:
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise EstimatorInputError("chat_template", f"not a valid template ({err})") from None
    specials = {
        k: _token_text(tok.config.get(k))
        for k in ("bos_token", "eos_token", "pad_token", "unk_token")
    }

    def render(messages: list[Any]) -> str:
        return compiled.render(messages=messages, add_generation_prompt=False, **specials)

    return render


# -- reading rows ----------------------------------------------------------------------------------


def _bar(total: int, unit: str, show: bool) -> Any:
    """A tqdm bar on stderr (None when not shown or tqdm is missing)."""
    if not show:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total, unit=unit, unit_scale=True, file=sys.stderr, desc="tokens", leave=False
    )


class _Progress:
    """Counts bytes read from a file object into a tqdm bar (stderr), when the file is long."""

    def __init__(self, raw: IO[bytes], total: int, show: bool | None) -> None:
        self.raw = raw
        self.bar: Any = _bar(total, "B", show if show is not None else total > PROGRESS_BYTES)

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if self.bar is not None:
            self.bar.update(len(data))
        return data

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


def _column(table: Any, name: str, path: Path) -> list[Any]:
    if name not in table.schema.names:
        raise EstimatorInputError(
            FIELD, f"{path.name}: no field {name!r} (fields: {', '.join(table.schema.names)})"
        )
    values: list[Any] = table.column(name).to_pylist()
    return values


def iter_rows(path: Path, name: str, show: bool | None = None) -> Iterator[list[Any]]:
    """The values of field `name`, in batches, from a .jsonl/.json/.parquet/.csv file."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise EstimatorInputError(FIELD, f"{path.name}: expected one of {', '.join(SUFFIXES)}")
    if suffix == ".json" and _first_char(path) == "[":
        yield from _json_rows(path, name)
        return
    if suffix == ".json":  # JSON lines under a .json name: `datasets.Dataset.to_json` default
        suffix = ".jsonl"
    try:
        import pyarrow as pa
    except ImportError:
        raise EstimatorInputError(
            FIELD, "reading datasets needs pyarrow (pip install 'trainfit[inputs]')"
        ) from None
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            reader = pq.ParquetFile(path)
        except pa.ArrowException as err:
            raise EstimatorInputError(FIELD, f"{path.name}: not a parquet file ({err})") from None
        if name not in reader.schema_arrow.names:
            names = ", ".join(reader.schema_arrow.names)
            raise EstimatorInputError(FIELD, f"{path.name}: no field {name!r} (fields: {names})")
        long = path.stat().st_size > PROGRESS_BYTES
        bar = _bar(reader.metadata.num_rows, "rows", show if show is not None else long)
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=[name]):
            if bar is not None:
                bar.update(batch.num_rows)
            yield batch.column(0).to_pylist()
        if bar is not None:
            bar.close()
        return
    yield from _streamed_rows(path, name, suffix, show)


def _streamed_rows(path: Path, name: str, suffix: str, show: bool | None) -> Iterator[list[Any]]:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    done = 0
    with path.open("rb") as raw:
        source = _Progress(raw, path.stat().st_size, show)
        try:
            stream = pcsv.open_csv(source) if suffix == ".csv" else pjson.open_json(source)
            for batch in stream:
                values = _column(batch, name, path)
                done += len(values)
                yield values
        except pa.ArrowInvalid as err:
            if suffix == ".csv":
                raise EstimatorInputError(FIELD, f"{path.name}: not valid CSV ({err})") from None
            # rows whose types differ (pyarrow infers one schema): go on line by line
            yield from _json_lines(path, name, skip=done)
        finally:
            source.close()


def _json_lines(path: Path, name: str, skip: int = 0) -> Iterator[list[Any]]:
    """Python's JSON parser, one line at a time, after the first `skip` rows."""
    batch: list[Any] = []
    seen = 0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise EstimatorInputError(
                    FIELD, f"{path.name} line {n}: not JSON ({err.msg})"
                ) from None
            batch.append(row.get(name) if isinstance(row, dict) else None)
            if len(batch) >= BATCH_ROWS:
                yield batch
                batch = []
    if batch:
        yield batch


def _first_char(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1].decode("ascii", "replace")


def _json_rows(path: Path, name: str) -> Iterator[list[Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EstimatorInputError(FIELD, f"{path.name}: not valid JSON ({err})") from None
    if not isinstance(data, list):
        raise EstimatorInputError(FIELD, f"{path.name}: a .json dataset is a list of objects")
    values = [row.get(name) if isinstance(row, dict) else None for row in data]
    if values and all(v is None for v in values):
        raise EstimatorInputError(FIELD, f"{path.name}: no field {name!r} in any row")
    for start in range(0, len(values), BATCH_ROWS):
        yield values[start : start + BATCH_ROWS]


# -- counting --------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(req: CountRequest, tok: TokenizerFiles, template: str | None) -> str:
    parts = [
        CACHE_VERSION,
        _sha256(req.dataset),
        _sha256(tok.tokenizer_json),
        hashlib.sha256((template or "").encode()).hexdigest(),
        json.dumps([req.text_field, req.messages_field, _token_text(tok.config.get("eos_token"))]),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _clean_messages(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise EstimatorInputError(FIELD, f"{where}: messages must be a list of objects")
    # pyarrow fills keys missing in a row with None; drop them so `is defined` tests hold
    return [
        {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in value
    ]


def count_tokens(
    req: CountRequest, cache_dir: Path | None = None, show_progress: bool | None = None
) -> CountResult:
    """Each sample's token count (rows without the field are skipped and counted)."""
    if not req.dataset.is_file():
        raise EstimatorInputError(FIELD, f"no such file {str(req.dataset)!r}")
    tok = find_tokenizer(req.tokenizer)
    if req.messages_field and req.chat_template is None:
        raise EstimatorInputError(
            "chat_template", "--messages-field needs --chat-template FILE or from-tokenizer"
        )
    template = chat_template(req.chat_template, tok) if req.chat_template else None
    if not req.messages_field:
        template = None
    cache = (cache_dir or default_cache_dir()) / f"{cache_key(req, tok, template)}.npy"
    if cache.is_file():
        import numpy as np

        return CountResult([int(n) for n in np.load(cache)], 0, True, str(cache))
    lengths, skipped = _encode_all(req, tok, template, show_progress)
    if not lengths:
        raise EstimatorInputError(FIELD, f"{req.dataset.name}: no sample to count")
    try:
        import numpy as np

        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, np.asarray(lengths, dtype=np.int64))
        stored: str | None = str(cache)
    except OSError:
        stored = None  # an unwritable cache only costs the next run its time
    notes = [f"{skipped} rows without {req.messages_field or req.text_field!r} skipped"] * bool(
        skipped
    )
    return CountResult(lengths, skipped, False, stored, notes)


def _encode_all(
    req: CountRequest, tok: TokenizerFiles, template: str | None, show: bool | None
) -> tuple[list[int], int]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise EstimatorInputError("tokenizer", "counting tokens needs `tokenizers`") from None
    try:
        tokenizer = Tokenizer.from_file(str(tok.tokenizer_json))
    except Exception as err:  # the Rust side raises plain Exception on a bad file
        raise EstimatorInputError("tokenizer", f"{tok.tokenizer_json}: {err}") from None
    render = template_renderer(template, tok) if template is not None else None
    eos = _token_text(tok.config.get("eos_token"))
    lengths: list[int] = []
    skipped = 0
    name = req.messages_field or req.text_field
    for batch in iter_rows(req.dataset, name, show):
        texts: list[str] = []
        for value in batch:
            if value is None:
                skipped += 1
            elif render is not None:
                texts.append(_render(render, value, len(lengths) + len(texts) + skipped))
            else:
                text = str(value)
                texts.append(text + eos if eos and not text.endswith(eos) else text)
        encoded = tokenizer.encode_batch_fast(texts, add_special_tokens=render is None)
        lengths.extend(len(e) for e in encoded)  # Encoding.__len__: its token count
    return lengths, skipped


def _render(render: Callable[[list[Any]], str], value: object, row: int) -> str:
    try:
        return render(_clean_messages(value, f"row {row + 1}"))
    except EstimatorInputError:
        raise
    except Exception as err:  # jinja2 errors, raise_exception() in the template
        raise EstimatorInputError("chat_template", f"row {row + 1}: {err}") from None


# -- the command line's view -----------------------------------------------------------------------


def dataset_lengths_for(options: dict[str, Any], stderr: IO[str] | None = None) -> list[int] | None:
    """`--dataset` with `--tokenizer` (counted here) and `--packing` (rows packed at the longest
    `--seq`, estimator.packing); None when the dataset is a file of lengths for
    estimator.time.tokens.read_lengths (no tokenizer, no packing)."""
    from estimator.packing import pack_lengths, packing_report, trl_strategy

    out = stderr or sys.stderr
    packing = bool(options.get("packing"))
    if not options.get("tokenizer") and not packing:
        return None
    if options.get("tokenizer"):
        cache = options.get("token_cache")
        result = count_tokens(
            CountRequest(
                dataset=Path(str(options["dataset"])),
                tokenizer=str(options["tokenizer"]),
                text_field=str(options.get("text_field") or "text"),
                messages_field=options.get("messages_field"),
                chat_template=options.get("chat_template"),
            ),
            Path(cache) if cache else None,
        )
        where = "cached" if result.cached else "counted"
        out.write(
            f"trainfit: dataset: {len(result.lengths)} samples {where} ({result.cache_file})\n"
        )
        for note in result.notes:
            out.write(f"trainfit: dataset: {note}\n")
        lengths = result.lengths
    else:
        from estimator.time.tokens import read_lengths

        lengths = read_lengths(str(options["dataset"]), field="--dataset")
    if not packing:
        return lengths
    seq = options.get("seq")
    if not seq:
        raise EstimatorInputError("packing", "--packing needs --seq (the packed row length)")
    seq_lens = sorted({int(float(s)) for s in str(seq).split(",") if s.strip()})
    seq_len = seq_lens[-1]
    strategy, approx = trl_strategy(options.get("packing_strategy") or "bfd")
    if approx:
        out.write(f"trainfit: dataset: {approx}\n")
    for fit in packing_report(lengths, seq_lens, strategy):
        out.write(
            f"trainfit: dataset: packed at {fit['max_seq']}: {fit['samples']} samples -> "
            f"{fit['rows']} rows, fill {float(fit['fill']):.1%}, tokens kept "  # type: ignore[arg-type]
            f"{fit['tokens_kept']} of {fit['tokens_total']} ({strategy})\n"
        )
    return pack_lengths(lengths, seq_len, strategy)  # the rows the longest --seq trains on
