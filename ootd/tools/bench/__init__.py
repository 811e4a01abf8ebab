"""The benchmark: our try-on pipeline timed stage by stage, its peak memory next to the memory planner's
estimate, and, for comparison, the original OOTDiffusion formulation run on the same weights and inputs.

Not part of the library's try-on path (nothing in ootd imports it but `ootd bench`):
- `architectures`: the tiny and full-size component configs and the hand-made tokenizer, shared with
  `scripts/make_tiny_checkpoints.py` and the tests;
- `random_weights`: models of those architectures with random weights, synthetic inputs;
- `reference`: the original formulation, a documented oracle (docs/upstream.md §4, §5);
- `profiling`: peak memory, per-stage timing, profiler tables, machine description;
- `flops`: FLOPs per step on the meta device; `side_by_side`: alternating UNet calls, ours vs the original;
- `drivers`, `matrix`: `run_bench` and `run_matrix`, which `ootd bench` and `scripts/bench_pipeline.py` call.

Nothing is imported here, so that `ootd --help` does not load torch.
"""
