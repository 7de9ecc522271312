"""Token accounting: length files, max sequence length, stages, Chinchilla."""

from __future__ import annotations

from pathlib import Path

import pytest

from estimator.errors import EstimatorInputError
from estimator.spec import params_only_spec
from estimator.time.tokens import (
    chinchilla_tokens,
    fit_seq_len,
    length_stats,
    read_lengths,
    resolve_stages,
    resolve_tokens,
    seq_len_report,
)

LENGTHS = Path(__file__).parents[2] / "data" / "lengths"


def test_seed_000_lengths_drop_15_of_52_at_32k() -> None:
    lengths = read_lengths(LENGTHS / "seed000_lengths.csv")
    stats = length_stats(lengths)
    # the seed's figures: 52 samples, p50 24.8k, p90 39560
    assert stats.samples == 52
    assert stats.p50 == pytest.approx(24_800, rel=0.01)
    assert stats.p90 == 39_560
    fit = fit_seq_len(lengths, 32_000)
    assert (fit.dropped, fit.kept) == (sum(n > 32_000 for n in lengths), 52 - fit.dropped)
    assert fit.dropped == 15  # "32k would drop 15 of 52 samples (29 %)"
    assert round(100 * fit.dropped / fit.samples) == 29
    assert fit.tokens_kept == sum(n for n in lengths if n <= 32_000)


def test_truncation_keeps_every_sample_and_caps_its_tokens() -> None:
    lengths = [100, 5000, 9000]
    fit = fit_seq_len(lengths, 4096, "truncate")
    assert (fit.kept, fit.truncated, fit.dropped) == (1, 2, 0)
    assert fit.tokens_kept == 100 + 2 * 4096
    report = seq_len_report(lengths, [4096, 16000])
    assert [r["dropped"] for r in report["by_max_seq"]] == [2, 0]
    assert report["stats"]["max"] == 9000


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("a.csv", "id,n_tokens\na,10\nb,20\n"),
        ("b.csv", "10\n20\n"),
        ("c.jsonl", '{"tokens": 10}\n\n{"length": 20}\n'),
        ("d.json", '[10, {"n_tokens": 20}]'),
        ("e.txt", "10\n20\n"),
    ],
)
def test_length_files_in_every_format(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    assert read_lengths(tmp_path / name) == [10, 20]


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("bad.csv", "length\n10\nten\n", "line 3"),
        ("bad.jsonl", '{"length": 10}\n{"length": 1.5}\n', "line 2"),
        ("bad.jsonl", '{"length": 10}\n{oops\n', "line 2"),
        ("bad.txt", "10\n\n-4\n", "line 3"),
        ("two.csv", "a,b\n1,2\n", "line 1"),
    ],
)
def test_bad_length_files_name_the_line(tmp_path: Path, name: str, text: str, line: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(EstimatorInputError) as err:
        read_lengths(tmp_path / name)
    assert err.value.field == "dataset"
    assert line in err.value.message


def test_chinchilla_is_20_tokens_per_parameter() -> None:
    assert chinchilla_tokens(8.03e9) == pytest.approx(160.6e9)  # seed 003: "about 160 billion"
    spec = params_only_spec(8.03e9)
    assert resolve_tokens(
        spec, tokens=None, target_tokens="chinchilla", dataset_lengths=None, epochs=1, max_seq=4096
    ) == pytest.approx(160.6e9)


def test_resolve_tokens_from_a_dataset_and_epochs() -> None:
    spec = params_only_spec(1e9)
    got = resolve_tokens(
        spec, tokens=None, target_tokens=None, dataset_lengths=[10, 20, 50], epochs=3, max_seq=30
    )
    assert got == 3 * 30
    with pytest.raises(EstimatorInputError):
        resolve_tokens(
            spec, tokens=1e6, target_tokens="chinchilla", dataset_lengths=None, epochs=1, max_seq=30
        )


def test_seed_000_stages_sum_to_6_4_million_tokens() -> None:
    run = resolve_stages(
        [
            {"name": "stage 1", "tokens": 2.53e6, "epochs": 1},
            {"name": "stage 2", "tokens": 1.28e6, "epochs": 3},
        ],
        max_seq=48_000,
    )
    assert run["tokens"] == pytest.approx(6.4e6, rel=0.01)
    lengths = read_lengths(LENGTHS / "seed000_lengths.csv")
    run = resolve_stages([{"name": "data", "lengths": lengths, "epochs": 2}], max_seq=32_000)
    assert run["tokens"] == 2 * fit_seq_len(lengths, 32_000).tokens_kept
    assert run["stages"][0]["fit"]["dropped"] == 15
