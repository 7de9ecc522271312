"""The time-and-cost wing, built like the memory wing: one module per thing it owns.

- `flops` — FLOPs per step by layer kind (forward, backward, recompute; model FLOPs for MFU).
- `step` — step time on a GPU option: max(compute, memory) + exposed offload + communication.
- `tokens` — how many tokens the run trains on: counts, Chinchilla, datasets' length files.
- `cost` — prices per GPU-hour (catalog or overrides) and the ranking of fitting options.
- `calibration` — a measured step -> achieved efficiency -> every option re-priced.
- `plan` — the one place that composes them for a row of the estimate document.

Each takes a `estimator.scenario.Scenario` plus what varies. Nothing here imports the memory
wing; the memory figures a time needs (host bytes of offloaded checkpoints) are passed in.
"""
