"""Text-to-image conditions: a prompt becomes the caption condition a LlamaGen t2i target takes.

``clean`` (caption cleaning as in training) -> ``encoder`` (tokenizer, the ``text_encode`` graph, left padding, a
per-process cache) -> the target, whose CFG null condition is its checkpoint's ``uncond_embedding``. ``export``
turns a T5-family encoder that ``transformers`` loads into the engine folder's ``text_encode`` graph.
"""
