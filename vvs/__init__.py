"""vvs: VVS speculative decoding of LlamaGen-class visual autoregressive models on ONNX Runtime and TensorRT."""
__version__ = "0.1.0"
