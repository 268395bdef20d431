"""vvs: speculative decoding of visual autoregressive image generators (LlamaGen, MAR) on ONNX Runtime and TensorRT.

From Python, three names cover most uses:

- ``vvs.engines.load_engines(folder, backend="auto")``: open an engine folder that ``vvs-export`` wrote;
- ``vvs.runtime.pipeline.Pipeline(engines)``: generate with a LlamaGen folder's engines (a MAR folder's pipeline is
  ``vvs.families.mar.pipeline.MARPipeline``), for example
  ``Pipeline(load_engines("engines")).generate([3, 7], mode="vvs", seed=0).pil_images()``
  (class ids or class names; prompts for a text-to-image folder); ``mode`` is one of ar, sd, sjd, sjd-pac (exact),
  lantern, vvs, gsd (they change the distribution by design);
- ``vvs.serve.client.Client(url)``: the same against a running ``vvs-serve`` (which also speaks OpenAI's images
  API, so the ``openai`` package works too).

The commands ``vvs-export``, ``vvs-run``, ``vvs-bench``, ``vvs-serve`` and ``vvs-train`` each take ``--help``.
"""
__version__ = "0.1.0"
