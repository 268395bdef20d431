"""Janus-Pro (deepseek-ai/Janus): its image-generation path as a discrete-token target that the shared machinery
(:mod:`vvs.discrete`: graphs, exporter, engine sets; the shared speculative loop) decodes, with its own loaders,
prompts and guidance null. Its registry entry is :mod:`vvs.families.janus_pro.family`."""
