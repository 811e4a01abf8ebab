"""The published method only (docs/upstream.md §3-§5): prompt conditioning, the garment/try-on fusion through
self-attention, image guidance and the latent mask, the denoising loop as a plain function, the schedulers.

Nothing here changes what is computed for speed; that is `ootd.speedups`. Imports `ootd.attention`,
`ootd.weights` (quiet loading), `ootd.settings` and `ootd.errors`.
"""
