"""Token counts from a dataset with the shipped word-level tokenizer (examples/dataset): every
text is `<s>` + its whitespace/punctuation pieces + `</s>`, so the expected counts are computed
here by hand, independently of `tokenizers`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.dataset_tokens import CountRequest, count_tokens, dataset_lengths_for
from estimator.errors import EstimatorInputError
from estimator.packing import pack_lengths, packing_report
from trainfit.cli import main

DATA = Path(__file__).resolve().parents[2] / "examples" / "dataset"
TOKENIZER = str(DATA / "tokenizer.json")


def rows(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line]


def text_count(text: str) -> int:
    return 1 + len(text.split()) + 1  # <s>, one token per piece (sentences end in " ."), </s>


def chat_count(messages: list[dict[str, str]]) -> int:
    # <s>, then per message: <|im_start|> role (newline is whitespace) pieces <|im_end|>
    return 1 + sum(3 + len(m["content"].split()) for m in messages)


def test_text_jsonl_counts_bos_pieces_and_eos(tmp_path: Path) -> None:
    result = count_tokens(CountRequest(DATA / "texts.jsonl", TOKENIZER), tmp_path)
    assert result.lengths == [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    assert not result.cached and result.skipped == 0


def test_chat_messages_through_the_tokenizers_template(tmp_path: Path) -> None:
    req = CountRequest(DATA / "chats.jsonl", str(DATA), "text", "messages", "from-tokenizer")
    result = count_tokens(req, tmp_path)
    expected = [chat_count(r["messages"]) for r in rows("chats.jsonl")]  # type: ignore[arg-type]
    assert result.lengths == expected


def test_template_file_and_missing_template(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    req = CountRequest(DATA / "chats.jsonl", TOKENIZER, "text", "messages", str(template))
    lengths = count_tokens(req, tmp_path).lengths
    first = rows("chats.jsonl")[0]["messages"]
    assert lengths[0] == sum(len(m["content"].split()) for m in first)  # type: ignore[union-attr,index]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((DATA / "tokenizer.json").read_bytes())
    with pytest.raises(EstimatorInputError) as err:
        count_tokens(
            CountRequest(DATA / "chats.jsonl", str(bare), "text", "messages", "from-tokenizer"),
            tmp_path,
        )
    assert err.value.field == "chat_template"


def test_parquet_csv_and_json_give_the_same_counts(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    data = rows("texts.jsonl")
    table = pa.table({"id": [r["id"] for r in data], "text": [r["text"] for r in data]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    pcsv.write_csv(table, tmp_path / "t.csv")
    (tmp_path / "t.json").write_text(json.dumps(data))
    # datasets' Dataset.to_json writes JSON lines under a .json name by default
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in data) + "\n")
    expected = [text_count(str(r["text"])) for r in data]
    for name in ("t.parquet", "t.csv", "t.json", "lines.json"):
        assert count_tokens(CountRequest(tmp_path / name, TOKENIZER), tmp_path).lengths == expected


def test_rows_of_mixed_types_fall_back_to_line_parsing(tmp_path: Path) -> None:
    lines = [json.dumps({"text": "hello world ."})] * 3000  # more than pyarrow's first block
    lines.append(json.dumps({"text": "fits ?", "extra": [1, "mixed", {"a": None}]}))
    lines.append(json.dumps({"other": 1}))  # no text: skipped and counted
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = count_tokens(CountRequest(path, TOKENIZER), tmp_path)
    assert result.lengths == [5] * 3000 + [4]
    assert result.skipped == 1


def test_lengths_are_cached_by_content(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "a b c"}) + "\n")
    first = count_tokens(CountRequest(path, TOKENIZER), tmp_path / "cache")
    again = count_tokens(CountRequest(path, TOKENIZER), tmp_path / "cache")
    assert (first.cached, again.cached) == (False, True)
    assert again.lengths == first.lengths == [5]
    path.write_text(json.dumps({"text": "a b c d e"}) + "\n")  # new content, new key
    changed = count_tokens(CountRequest(path, TOKENIZER), tmp_path / "cache")
    assert (changed.cached, changed.lengths) == (False, [7])


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    cases = [
        (CountRequest(tmp_path / "none.jsonl", TOKENIZER), "dataset"),
        (CountRequest(DATA / "texts.jsonl", str(tmp_path / "no-tokenizer.json")), "tokenizer"),
        (CountRequest(DATA / "texts.jsonl", TOKENIZER, text_field="body"), "dataset"),
        (CountRequest(DATA / "chats.jsonl", TOKENIZER, "text", "messages", None), "chat_template"),
        (CountRequest(DATA / "make_tokenizer.py", TOKENIZER), "dataset"),
    ]
    for req, field in cases:
        with pytest.raises(EstimatorInputError) as err:
            count_tokens(req, tmp_path)
        assert err.value.field == field, req


def test_bfd_packing_follows_trl_example() -> None:
    # trl/data_utils.py pack_dataset docstring: lengths [5, 2, 3, 1] at seq_length 4
    assert sorted(pack_lengths([5, 2, 3, 1], 4, "bfd")) == [2, 4, 4]  # 5 cut to 4
    assert sorted(pack_lengths([5, 2, 3, 1], 4, "bfd_split")) == [3, 4, 4]  # nothing lost
    assert pack_lengths([5, 2, 3, 1], 4, "wrapped") == [4, 4, 3]


def test_bfd_is_best_fit_not_first_fit() -> None:
    # decreasing 8 7 5 4 2 1 into rows of 10: 8 -> A, 7 -> B, 5 -> C, 4 -> C, 2 -> A (2 free);
    # then 1 goes to the row with the least room that holds it, C (1 free), not B (3 free);
    # first fit would put it in B and give [8, 9, 10]
    assert sorted(pack_lengths([7, 1, 8, 5, 4, 2], 10, "bfd")) == [7, 10, 10]


def test_packing_runs_per_block_of_1000_like_datasets_map() -> None:
    lengths = [3] * 1500
    assert len(pack_lengths(lengths, 10, "bfd")) == 334 + 167  # 1000 -> 334 rows, 500 -> 167
    assert len(pack_lengths(lengths, 10, "bfd", block=0)) == 500


def test_packing_report_keeps_every_sample() -> None:
    report = packing_report([100, 300, 500, 900], [512, 1024])
    assert [r["rows"] for r in report] == [3, 2]
    assert [r["tokens_kept"] for r in report] == [100 + 300 + 500 + 512, 1800]
    assert [r["samples_cut"] for r in report] == [1, 0]
    assert all(r["dropped"] == 0 for r in report)


def test_dataset_lengths_for_packs_at_the_longest_seq(tmp_path: Path) -> None:
    options = {
        "dataset": str(DATA / "texts.jsonl"),
        "tokenizer": TOKENIZER,
        "token_cache": str(tmp_path),
        "packing": True,
        "seq": "256,1024",
    }
    packed = dataset_lengths_for(options, stderr=open(tmp_path / "err", "w"))  # noqa: SIM115
    counted = [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    assert packed == pack_lengths(counted, 1024)
    assert max(packed) <= 1024
    assert "packed at 256" in (tmp_path / "err").read_text()
    with pytest.raises(EstimatorInputError, match="needs --seq"):
        dataset_lengths_for({**options, "seq": None})


def estimate_argv(seq: str, cache: Path) -> list[str]:
    """`trainfit estimate` of TinyLlama over the shipped texts, counted with the tokenizer."""
    return [
        "estimate", "--model", "tinyllama-1.1b", "--gpu", "h100-80gb", "--seq", seq,
        "--dataset", str(DATA / "texts.jsonl"), "--tokenizer", TOKENIZER,
        "--token-cache", str(cache), "--format", "json",
    ]  # fmt: skip


def test_cli_uses_counted_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(estimate_argv("128,4096", tmp_path)) == 0
    doc = json.loads(capsys.readouterr().out)
    counted = [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    assert doc["dataset"]["stats"]["samples"] == len(counted)
    assert doc["dataset"]["stats"]["tokens"] == sum(counted)
    assert doc["dataset"]["by_max_seq"][0]["dropped"] == sum(1 for n in counted if n > 128)


def test_a_tokenizer_by_hub_id_from_the_local_endpoint(tmp_path: Path, hub_env: Path) -> None:
    from tests.estimator.hub_server import HubHandler

    result = count_tokens(CountRequest(DATA / "texts.jsonl", "acme/tiny-tokenizer"), tmp_path)
    assert result.lengths == [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    asked = {r.split()[1].split("/")[-1] for r in HubHandler.requests}
    assert {"tokenizer.json", "tokenizer_config.json"} <= asked  # and nothing heavier
    assert (hub_env / "models--acme--tiny-tokenizer").is_dir()


def test_a_progress_bar_on_stderr_for_long_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    result = count_tokens(CountRequest(DATA / "texts.jsonl", TOKENIZER), tmp_path, True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "tokens:" in captured.err and "B/s" in captured.err  # tqdm over the bytes read
    assert len(result.lengths) == len(rows("texts.jsonl"))
    count_tokens(CountRequest(DATA / "texts.jsonl", TOKENIZER), tmp_path / "quiet", None)
    assert capsys.readouterr().err == ""  # a small file: no bar


def test_percentiles_and_the_recommendation_use_the_counted_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np = pytest.importorskip("numpy")
    counted = [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    common = ["--model", "tinyllama-1.1b", "--gpu", "h100-80gb", "--format", "json"]
    data = ["--dataset", str(DATA / "texts.jsonl"), "--tokenizer", TOKENIZER]
    data += ["--token-cache", str(tmp_path)]
    assert main(["estimate", *common, *data, "--seq", "128,256"]) == 0
    stats = json.loads(capsys.readouterr().out)["dataset"]["stats"]
    assert stats["p50"] == pytest.approx(float(np.percentile(counted, 50)))
    assert stats["p90"] == pytest.approx(float(np.percentile(counted, 90)))
    assert main(["recommend", *common, *data, "--seq", "256", "--price", "h100-80gb=2"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    kept = [n for n in counted if n <= 256]
    assert (row["dataset"]["kept"], row["dataset"]["dropped"]) == (
        len(kept),
        len(counted) - len(kept),
    )
    assert row["dataset"]["tokens_kept"] == sum(kept)
    assert row["cost"]["usd"] > 0


def test_packing_turns_dropped_samples_into_packed_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counted = [text_count(str(r["text"])) for r in rows("texts.jsonl")]
    argv = estimate_argv("256", tmp_path)
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["dataset"]["by_max_seq"][0]
    assert plain["dropped"] == sum(1 for n in counted if n > 256) > 0
    assert main([*argv, "--packing"]) == 0
    packed = json.loads(capsys.readouterr().out)["dataset"]
    assert packed["by_max_seq"][0]["dropped"] == 0
    assert packed["stats"]["samples"] == len(pack_lengths(counted, 256)) < len(counted)


def test_the_length_cache_is_keyed_by_the_tokenizer_and_the_field_too(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "a b c", "body": "a b c d e f"}) + "\n")
    cache = tmp_path / "cache"
    first = count_tokens(CountRequest(data, TOKENIZER), cache)
    bare = tmp_path / "bare"  # the same tokenizer without its post-processor: no <s>
    bare.mkdir()
    spec = json.loads((DATA / "tokenizer.json").read_text())
    spec["post_processor"] = None
    (bare / "tokenizer.json").write_text(json.dumps(spec))
    (bare / "tokenizer_config.json").write_text((DATA / "tokenizer_config.json").read_text())
    other = count_tokens(CountRequest(data, str(bare)), cache)
    assert not other.cached and other.lengths == [first.lengths[0] - 1]
    body = count_tokens(CountRequest(data, TOKENIZER, text_field="body"), cache)
    assert not body.cached and body.lengths == [text_count("a b c d e f")]
    assert count_tokens(CountRequest(data, TOKENIZER), cache).cached


def test_a_parquet_file_gets_a_bar_counting_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("tqdm")
    import pyarrow.parquet as pq

    data = rows("texts.jsonl")
    pq.write_table(pa.table({"text": [r["text"] for r in data]}), tmp_path / "t.parquet")
    count_tokens(CountRequest(tmp_path / "t.parquet", TOKENIZER), tmp_path, True)
    err = capsys.readouterr().err
    assert "tokens:" in err and "rows" in err


def test_the_shipped_tokenizer_is_what_make_tokenizer_builds(tmp_path: Path) -> None:
    """examples/dataset/tokenizer.json is built here by the script beside it (nothing
    downloaded): the same vocabulary, pre-tokenizer and post-processor."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tokenizer", DATA / "make_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build_tokenizer().save(str(tmp_path / "tokenizer.json"))
    built = json.loads((tmp_path / "tokenizer.json").read_text())
    assert built == json.loads((DATA / "tokenizer.json").read_text())
