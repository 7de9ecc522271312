"""The autograd engine's gradient sums, done in place as on CUDA (probe/grad_sums.py).

Under any dispatch mode the engine's input buffer sums a tied weight's two gradient
contributions out of place (`isTensorSubclassLike` is true for every tensor while a mode is
active); a CUDA step without the tracker adds the second into the first, which becomes the
gradient. The tracker's classification must book that first contribution as a trainable state.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probe.grad_sums import cuda_events, first_contributions  # noqa: E402
from probe.tracker import GRANULARITY, StorageTracker  # noqa: E402


def test_a_chain_of_sums_is_renamed_to_the_first_contribution():
    # 1 and 2 summed into 3, 3 and 4 into 5 (the gradient); 6 is an unrelated sum
    sums = {3: 1, 5: 3, 6: 2}
    assert first_contributions(sums, {5}) == {5: 3, 3: 1}
    log = [(1, 100), (2, 100), (3, 100), (1, -100), (2, -100), (4, 100), (5, 100), (3, -100)]
    log += [(4, -100), (5, -100)]
    events = cuda_events(log, {5: 3, 3: 1})
    assert len(events) == len(log)  # indices into the log still hold
    on_cuda = [(1, 100), (2, 100), (2, -100), (4, 100), (4, -100), (1, -100)]
    assert [e for e in events if e[1]] == on_cuda


def test_a_sum_that_is_no_gradient_is_left_alone():
    log = [(1, 100), (2, 100), (3, 100), (1, -100), (2, -100)]
    assert cuda_events(log, first_contributions({3: 1}, set())) == log


def test_index_backward_scatters_into_its_zeros_on_cuda():
    # MoE: the gather's backward makes zeros (1) and, under the tracker, index_put's copy (2)
    log = [(1, 100), (2, 100), (1, -100), (2, -100)]
    assert [e for e in cuda_events(log, {2: 1}) if e[1]] == [(1, 100), (1, -100)]


def _tied_step(vocab: int, hidden: int, tokens: int) -> dict[str, int]:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(vocab, hidden)
    ids = torch.randint(0, vocab, (tokens,))
    with StorageTracker(vocab=vocab) as tracker:
        tracker.adopt([emb.weight])
        tracker.begin_window()
        logits = emb(ids) @ emb.weight.t()  # a tied head: two contributions to one gradient
        logits.float().logsumexp(-1).sum().backward()
        del logits
        return tracker.component_maxima([emb.weight], [emb.weight.grad], [])


def test_a_tied_weights_first_gradient_contribution_is_a_trainable_state():
    vocab, hidden, tokens = 1024, 64, 8
    grad = -(-vocab * hidden * 4 // GRANULARITY) * GRANULARITY
    maxima = _tied_step(vocab, hidden, tokens)
    assert maxima["trainable_states"] == grad
    # the head's weight gradient (vocab x hidden) is no activation; the embedding's (the second
    # contribution, added into the first) is, until the sum: one vocab x hidden buffer and a few
    # KiB, not two (the out-of-place sum's log has both alive at the sum)
    assert grad <= maxima["activations"] < grad + grad // 8, maxima


def test_an_allocation_trace_replays_the_sum_in_place():
    # a tied weight's two 12 MiB gradient contributions (1, 2) summed out of place into 3, as
    # recorded under a dispatch mode; on CUDA 2 is added into 1, which becomes the gradient.
    # Large-pool requests (>= 10 MiB) get their own segment rounded to 2 MiB: the recorded
    # order reserves three 12 MiB segments, the in-place one two.
    from probe.allocator import AllocatorConfig, replay
    from probe.allocator_events import alloc, free
    from probe.grad_sums import cuda_trace

    mib = 2**20
    recorded = [alloc(1, 12 * mib), alloc(2, 12 * mib), alloc(3, 12 * mib), free(1), free(2)]
    recorded += [free(3)]
    on_cuda = cuda_trace(recorded, {3: 1})
    assert on_cuda == [alloc(1, 12 * mib), alloc(2, 12 * mib), free(2), free(1)]
    cfg = AllocatorConfig(device_memory=2**30)
    assert replay(recorded, cfg).peak_reserved == 36 * mib
    assert replay(on_cuda, cfg).peak_reserved == 24 * mib
    assert replay(on_cuda, cfg).peak_allocated == 24 * mib


def test_a_recorded_tied_step_is_replayed_with_its_gradient_sum_in_place():
    # the probe's tracker, recording (probe.allocator_trace.record_probe_tracker): the trace's
    # in-place pairs come from the tracker's own detection, in the trace's ids; replayed as
    # CUDA runs it, the out-of-place sum's vocab x hidden fp32 buffer is never allocated
    import probe.runner
    from probe.allocator import AllocatorConfig, replay
    from probe.allocator_trace import record_probe_tracker

    vocab, hidden, tokens = 1024, 64, 8
    torch.manual_seed(0)
    emb = torch.nn.Embedding(vocab, hidden)
    ids = torch.randint(0, vocab, (tokens,))
    with record_probe_tracker() as trace, probe.runner.StorageTracker(vocab=vocab) as tracker:
        tracker.adopt([emb.weight])
        tracker.begin_window()
        logits = emb(ids) @ emb.weight.t()
        logits.float().logsumexp(-1).sum().backward()
        del logits
        tracker.mark_optimizer_step()  # the gradients are alive: the pairs are resolved
        assert emb.weight.grad is not None
        freed = {ev.id for ev in trace.events if ev.op == "free"}
    # one pair: the sum (alive: the gradient) and its first contribution (freed after the sum)
    (result, first), *more = trace.in_place.items()
    assert not more and result not in freed and first in freed
    grad = vocab * hidden * 4
    recorded = replay(trace.events, AllocatorConfig(device_memory=2**30))
    on_cuda = replay(trace.cuda_events(), AllocatorConfig(device_memory=2**30))
    assert len(trace.cuda_events()) == len(trace.events) - 2  # the sum's alloc, 1st's free
    assert recorded.peak_allocated - on_cuda.peak_allocated > grad - grad // 64
