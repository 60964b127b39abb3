"""Where the work runs: device and precision, seeds and random state, and several processes (torchrun, accelerate).

Modules: `device` (auto choices, autocast, loss scaling, threads, TF32, compile, peak memory), `randomness`
(seeds, derived generators, RNG state for resume), `distributed` (process group, shards, gathered negatives,
rank-0 I/O), for the encoder and the training engine alike.
"""
