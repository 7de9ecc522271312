"""Recording allocation traces from torch, and replaying a real CPU probe step."""

from __future__ import annotations

from typing import Any

import torch

from probe.allocator_events import Event, alloc, free
from probe.allocator_trace import record_allocations


def test_records_each_storage_once_and_its_release() -> None:
    x = torch.zeros(10)  # created before recording: adopted, so it counts from the start
    with record_allocations(adopt=[x]) as trace:
        a = torch.ones(1000)  # 4000 bytes
        view = a[:10]  # a view: same storage, no new event
        b = a * 2  # 4000 bytes
        del a  # the view still holds the storage
        del view  # now the storage of `a` is released
        c = b.to(torch.float16)  # 2000 bytes
        del b
    after = torch.ones(3)  # after the block: not recorded
    assert trace.events == [
        alloc(0, 40),
        alloc(1, 4000),
        alloc(2, 4000),
        free(1),
        alloc(3, 2000),
        free(2),
    ]
    del c, x, after
    assert len(trace.events) == 6  # frees after the block are not recorded either


def test_markers_and_device_filter() -> None:
    with record_allocations(device="cuda") as trace:
        y = torch.ones(100)  # a CPU tensor: filtered out
        trace.reset_peak()
    del y
    assert trace.events == [Event("reset_peak")]


def test_replayed_cpu_step_has_the_tracker_peak(tiny_llama: dict[str, Any]) -> None:
    # One probe run (model build + one training step) recorded both ways and replayed. The
    # replay's allocated peak equals the probe's own StorageTracker peak (both count storages
    # rounded to 512 B; this tiny model has no large-pool rests, so both modes agree), for the
    # independent dispatch recorder (whole run; the build's peak is lower here) and for the
    # tracker recorder (per-length marks). Reserved is at least allocated.
    from bench.allocator_replay import compare, record_run

    for recorder in ("dispatch", "tracker"):
        events, tracker_peak = record_run(tiny_llama, None, 64, steps=1, recorder=recorder)
        res = compare(events)
        assert res["off"].peak_allocated == tracker_peak
        assert res["on"].peak_allocated == tracker_peak
        assert res["off"].peak_reserved >= tracker_peak
        assert res["off"].final_allocated < res["off"].peak_allocated
        marks = [e.op for e in events if e.op in ("empty_cache", "reset_peak")]
        assert marks == ([] if recorder == "dispatch" else ["empty_cache", "reset_peak"])


def test_fake_trace_replays_like_the_cpu_trace(tiny_llama: dict[str, Any]) -> None:
    # The fake run is recorded through the probe's tracker (record_probe_tracker). For the setup
    # of tests/probe/test_fake_run.py, where fake and CPU peaks are equal, the replays of the
    # two traces give the same allocated and the same simulated reserved peaks.
    import probe.runner
    from bench.allocator_replay import compare, record_run

    setup = {"precision": "bf16", "optimizer": "lion", "checkpointing": "none"}
    before = probe.runner.StorageTracker
    cpu_events, cpu_peak = record_run(tiny_llama, setup, 256, steps=2, device="cpu")
    fake_events, fake_peak = record_run(tiny_llama, setup, 256, steps=2, device="fake")
    assert probe.runner.StorageTracker is before  # the patch is undone
    assert fake_peak == cpu_peak
    cpu, fake = compare(cpu_events), compare(fake_events)
    for mode in ("off", "on"):
        assert fake[mode].peak_allocated == cpu[mode].peak_allocated == cpu_peak
        assert fake[mode].peak_reserved == cpu[mode].peak_reserved
