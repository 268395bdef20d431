"""MAR (LTH14/mar) and continuous speculative decoding: models, loaders, graphs, exporter, engines, the sampler and
CSpD, the pipeline and the shipped pair's training. Its registry entry is :mod:`vvs.families.mar.family`."""
