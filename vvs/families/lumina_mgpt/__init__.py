"""Lumina-mGPT (Alpha-VLLM, the Chameleon architecture): its decoder as a discrete-token target that the shared
machinery (:mod:`vvs.discrete`: graphs, exporter, engine sets; the shared speculative loop) decodes, with
end-of-line tokens forced at row ends, its own loaders, prompts, guidance null and Chameleon's VQGAN. Its registry
entry is :mod:`vvs.families.lumina_mgpt.family`."""
