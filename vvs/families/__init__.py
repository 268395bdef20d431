"""Model families: one package each (``llamagen``, ``mar``), found through :mod:`vvs.families.registry`."""
