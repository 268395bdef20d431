"""Building blocks every family shares: layers, the VQ tokenizer (LlamaGen's VQ-16 / VQ-8, which MAR's shipped pair
and Janus-Pro also use), and the safe checkpoint readers. A family's own models live in ``vvs.families.<name>``."""
