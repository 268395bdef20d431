"""LlamaGen (FoundationVision/LlamaGen): its GPT target and conditions, its official checkpoints, its inflation to
the official sizes, and its shipped models and their training, on the discrete-token machinery
(:mod:`vvs.discrete`). Its registry entry is :mod:`vvs.families.llamagen.family`."""
