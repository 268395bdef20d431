"""The machinery every discrete-token family stands on (LlamaGen, Janus-Pro, Lumina-mGPT): the target contract
(:mod:`vvs.discrete.target`), each family's :class:`~vvs.discrete.arch.TargetArch`, model bundles, the graphs, the
exporter, the engine sets, the EAGLE drafter with its loader, trainer and inflation, ``vvs-bench --scale``, the
shipped pairs' training data, and the registry records' shared parts (:func:`vvs.discrete.family.discrete_family`).
A family's package holds only what differs; it reaches this package directly, and this package reaches a family
only through the registry."""
