"""A stand-in for the *runtime* half of ``tensorrt`` / ``tensorrt_rtx``, because executing a TensorRT plan needs a
GPU and these machines have none. Engines are built by the real TensorRT-RTX builder (tests/test_tensorrt.py);
this module only runs them.

``Runtime.deserialize_cuda_engine`` accepts exactly the plans registered in :data:`plans` (sha256 -> the ONNX
graph and profiles they were built from). Like TensorRT, a context rejects shapes outside its optimisation
profile; execution reads inputs from and writes outputs to the bound addresses, running the ONNX graph with ONNX
Runtime on the CPU, so the backend's binding, profile and runtime-cache logic runs end to end. What passes here
says nothing about TensorRT's kernels.
"""
from __future__ import annotations

import ctypes
import hashlib

import numpy as np
import onnx
import onnxruntime as ort

__version__ = "11.4.0.106"
calls: list[tuple] = []  # every runtime call, for tests to inspect
plans: dict[str, dict] = {}  # sha256 of a real plan -> {"onnx": path, "profiles": [...]}


class Logger:
    WARNING = 2
    ERROR = 1

    def __init__(self, severity=WARNING):
        self.severity = severity


NUMPY = {1: np.float32, 10: np.float16, 7: np.int64, 9: np.bool_}


class ExecutionContext:
    def __init__(self, engine):
        self.engine = engine
        self.profile = 0
        self.shapes, self.addresses = {}, {}

    def set_optimization_profile_async(self, index, stream):
        self.profile = index
        return True

    def set_input_shape(self, name, shape):
        lo, _, hi = self.engine.profiles[self.profile][name]
        if len(shape) != len(lo) or not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            raise ValueError(f"{name}: shape {shape} outside profile {self.profile} [{lo}, {hi}]")
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream):
        calls.append(("execute_async_v3", self.engine.onnx_path, self.profile))
        session = self.engine.session
        feed = {}
        for value in session.get_inputs():
            dtype = NUMPY[self.engine.types[value.name]]
            shape = self.shapes[value.name]
            feed[value.name] = _view(self.addresses[value.name], dtype, shape).copy()
        for value, result in zip(session.get_outputs(), session.run(None, feed)):
            target = _view(self.addresses[value.name], result.dtype, result.shape)
            target[...] = result
        return True


def _view(ptr, dtype, shape):
    count = int(np.prod(shape)) if len(shape) else 1
    buf = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


class Engine:
    def __init__(self, plan: dict):
        self.onnx_path = plan["onnx"]
        self.profiles = [{k: tuple(tuple(s) for s in v) for k, v in p.items()} for p in plan["profiles"]]
        self.session = ort.InferenceSession(self.onnx_path, providers=["CPUExecutionProvider"])
        model = onnx.load(self.onnx_path, load_external_data=False)
        self.types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}

    def create_execution_context(self, runtime_config=None):
        calls.append(("create_execution_context", self.onnx_path, runtime_config is not None))
        return ExecutionContext(self)

    def create_runtime_config(self):
        return RuntimeConfig()


class RuntimeCache:  # TensorRT-RTX
    def __init__(self):
        self.blob = b""

    def deserialize(self, blob) -> bool:
        self.blob = bytes(blob)
        return True

    def serialize(self):
        return self.blob + b"+specialised"


class RuntimeConfig:  # TensorRT-RTX
    def __init__(self):
        self.cache = None

    def create_runtime_cache(self):
        return RuntimeCache()

    def set_runtime_cache(self, cache):
        self.cache = cache
        return True


class Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data):
        plan = plans.get(hashlib.sha256(bytes(data)).hexdigest())
        return None if plan is None else Engine(plan)
