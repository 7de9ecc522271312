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
