"""Pipeline schedules (`--pp-schedule`): how many micro-batches' activations a pipeline rank
holds at once, the bubble, and the stage-boundary sends, read from the schedules torch 2.13
runs (torch/distributed/pipelining/schedules.py; torchtitan builds its pipelines from them).

p = pp ranks, m = micro-batches per step, v = virtual stages per rank (model chunks), r = rank.

1f1b (Schedule1F1B, schedules.py:995-1110): rank r runs `warmup_chunks = min(m, p - r)`
    forwards (:1052-1055), then alternates backward-then-forward ("1B1F", :1099-1101), so at most
    min(m, p - r) micro-batches are in flight: p on the first rank, 1 on the last (Narayanan et
    al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", section 2.2.1). Bubble (p - 1) / m of the ideal time.
gpipe (ScheduleGPipe, schedules.py:872-990): every forward (:905-922), then every backward
    (:933): m micro-batches in
    flight on every rank (and m losses' saved tensors on the last). Bubble (p - 1) / m (Huang et
    al. 2019, GPipe, section 2.2).
interleaved-1f1b (ScheduleInterleaved1F1B, schedules.py:2891-3005): each rank holds v chunks of
    L / (p v) layers; rounds = max(1, m // p), micro-batches per round mpr = m // rounds, and m
    must be a multiple of the rounds (:2935-2941). Rank r runs `_get_warmup_ops` =
    min((v - 1) mpr + 2 (p - 1 - r), m v) chunk forwards (:2872-2888), then `_get_1f1b_rank_ops`
    appends each steady-state forward before its backward (:2793-2808), so one more chunk is in
    flight while any steady-state op is left. In micro-batches of the whole rank (v chunks) the
    first rank holds (v p + p - 1) / v = p (1 + (p - 1) / (p v)) when m >= p: Megatron-LM's
    `interleaved_schedule_memory_penalty` (megatron/training/theoretical_memory_usage.py) and
    Narayanan et al. 2021 section 2.2.2. Bubble (p - 1) / (v m); stage-boundary sends v times
    1F1B's (same section: "the amount of communication also increases by v").
"""

from __future__ import annotations

SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe")
FIELD = "setup.pp_schedule"
# torchtitan@9dec370 torchtitan/parallelisms/pipelining_utils.py:22-28: a multi-stage
# (looped) schedule without split points gets 2 stages per rank.
DEFAULT_VIRTUAL = 2


def virtual_stages(schedule: str, given: int | None) -> int:
    """Model chunks per rank: `given`, else 2 for interleaved, 1 for single-stage schedules."""
    if schedule == "interleaved-1f1b":
        return given or DEFAULT_VIRTUAL
    return 1


def rounds(m: int, p: int) -> int:
    """Interleaved rounds of micro-batches (schedules.py:2935)."""
    return max(1, m // p)


def interleaved_warmup_ops(m: int, p: int, v: int, rank: int) -> int:
    """`_get_warmup_ops` with multiply_factor 2 (schedules.py:2872-2888)."""
    per_round = m // rounds(m, p)
    return min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)


def in_flight(schedule: str, m: int, p: int, v: int, rank: int) -> float:
    """Micro-batches (of the rank's whole share of layers, v chunks) whose activations rank
    `rank` holds at its busiest moment (module docstring)."""
    if p <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved-1f1b":
        warmup = interleaved_warmup_ops(m, p, v, rank)
        ops = warmup + (1 if warmup < m * v else 0)
        return ops / v
    return float(min(m, p - rank))


def reduced_per_chunk(schedule: str, m: int, p: int, v: int) -> bool:
    """Whether a rank's model chunks have their accumulated gradients reduced one after the
    other, so that only one chunk's unsharded gradients exist at a time (FSDP2 under PP).

    torch reduces a stage's gradients at that stage's own last backward: `_add_reduce_grad`
    (torch 2.13 pipelining/schedules.py:1252-1282) puts one REDUCE_GRAD per stage right after
    its m-th backward ("reduce_grad frees memory and we want to schedule it just after the last
    backward-like stage"), and `perform_reduce_grad` (stage.py:1164-1180) runs FSDP's
    post_backward with gradient sync on, which reduce-scatters the stage's gradients and frees
    their unsharded accumulation. Interleaved backwards run chunk by chunk, v - 1 first:
    `backward_stage_index` (schedules.py:2986-2993) takes the local chunk
    v - 1 - ((step - warmup) // mpr) % v, mpr micro-batches per chunk. With one round
    (m < 2p, mpr = m) every chunk's m backwards run back to back and it is reduced before the
    next chunk's first backward; with more rounds each chunk runs mpr backwards per round, so
    from the second round on every chunk holds a partial accumulation. A single-stage schedule
    (1F1B, GPipe) has one chunk."""
    return schedule == "interleaved-1f1b" and v > 1 and rounds(m, p) == 1


def held_at_chunk_backwards(m: int, v: int, in_flight_mb: float) -> tuple[float, float]:
    """Fractions of a rank's peak checkpoints (`in_flight_mb` micro-batches of v chunks) still
    held just after (a) the rank's first backward, which follows its in-flight peak
    (`_get_1f1b_rank_ops` appends the steady-state forward before the backward, :2793-2808) and
    is of chunk v - 1 (`backward_stage_index`), and (b) chunk 0's first backward when the chunks
    are reduced one after the other (`reduced_per_chunk`): every forward has run by then
    (warmup >= (v - 1) m, and chunk v - 1's m steady-state steps cover the rest), every later
    chunk's backwards are done, so only chunk 0's m micro-batches were left."""
    chunks = in_flight_mb * v
    if chunks <= 1:
        return 0.0, 0.0
    return (chunks - 1) / chunks, max(m - 1, 0) / chunks


def losses_in_flight(schedule: str, m: int, p: int) -> int:
    """Micro-batches whose loss (logits) the last rank keeps for their backward: the loss is
    computed right after each last-stage forward (schedules.py:299 `_maybe_compute_loss`,
    called at :922 and :1092), so
    GPipe keeps all m, the 1F1B schedules one."""
    return m if schedule == "gpipe" and p > 1 else 1


def accumulated_at_loss(schedule: str, m: int, p: int) -> bool:
    """Whether the last rank computes later micro-batches' losses after earlier ones'
    backwards, i.e. with the stage's gradients accumulating (FSDP2 under PP keeps them
    unsharded until the stage's last backward, `data._pipelined`). 1F1B: the steady state runs
    backward i, then forward i + 1 and its loss (torch 2.13 schedules.py:1099-1140, `1B1F`);
    the interleaved schedule appends each steady-state forward before its backward on the last
    rank's last chunk, which holds the loss (:2793-2808). GPipe runs every forward and loss
    before the first backward (:905-922, :933)."""
    return p > 1 and m > 1 and schedule != "gpipe"


def last_stage_outputs_kept(m: int, keeps: bool) -> int:
    """Micro-batch outputs (the model's output: the logits) the last stage holds at its
    busiest moment, the last micro-batch's loss and backward, when the stack's pipelining
    keeps them for the step's merged return value: every one (`_PipelineStageBase.
    forward_one_chunk` appends each to `output_chunks`, cleared at the next step's start,
    torch 2.13 stage.py:907-908 and schedules.py:772; `step()` returns
    `_merge_outputs(output_chunks)`, :795-796). 0 when the trainer passes `return_outputs=False`
    (pytorch/pytorch#165822) or the stack runs no torch pipelining."""
    return m if keeps else 0


def bubble(schedule: str, m: int, p: int, v: int) -> float:
    """Idle fraction of the ideal compute time: (p - 1) / (v m)."""
    if p <= 1:
        return 0.0
    return (p - 1) / ((v if schedule == "interleaved-1f1b" else 1) * m)


def boundary_sends(schedule: str, m: int, v: int) -> int:
    """Activation sends plus gradient sends per rank and step: 2 m, times v interleaved."""
    return 2 * m * (v if schedule == "interleaved-1f1b" else 1)


def boundary_tensors(m: int, v: int, in_flight_mb: float, first: bool, last: bool) -> float:
    """Stage-boundary tensors (one micro-batch's hidden states each) a pipeline rank keeps
    beyond its layers' saved activations (torch 2.13 pipelining/stage.py):
    - a receive buffer per micro-batch for each chunk's input, allocated once and kept
      (`_setup_forward_recv_info`, :2251-2275), except the first stage's; the in-flight
      micro-batches' are their first layer's saved input, already counted with the layers;
    - a receive buffer per micro-batch for each chunk's output gradient
      (`_setup_backward_recv_info`, :322-332, :2286-2316), except the last stage's;
    - each in-flight chunk forward's output, cached until its backward (`fwd_cache`, :913-916),
      except the last stage's (its output is the loss)."""
    chunks_in_flight = in_flight_mb * v
    recv_act = m * (v - (1 if first else 0))
    recv_grad = m * (v - (1 if last else 0))
    outputs = max(chunks_in_flight - (1 if last else 0), 0.0)
    overlap = min(float(recv_act), chunks_in_flight - (0 if not first else in_flight_mb))
    return recv_act + recv_grad + outputs - max(overlap, 0.0)
