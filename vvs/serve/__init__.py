"""Serving: the HTTP JSON API (:mod:`.api`), its Ray Serve deployment (:mod:`.deployment`, needs the ``serve``
extra) and a Python client (:mod:`.client`, standard library only)."""
