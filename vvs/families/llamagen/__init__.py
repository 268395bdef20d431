"""LlamaGen (FoundationVision/LlamaGen): its GPT target, EAGLE drafter, graphs, exporter, engine sets, conditions,
scale runs and shipped models. Its registry entry is :mod:`vvs.families.llamagen.family`."""
