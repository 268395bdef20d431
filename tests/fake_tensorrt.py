"""A stand-in for the ``tensorrt`` 11 Python module, because TensorRT cannot be installed on these machines.

It has the TensorRT 11 API surface vvs uses, and *only* what TensorRT 11 still has: no ``BuilderFlag.FP16`` /
``INT8``, no calibrators, no ``platform_has_fast_fp16`` — using a removed API raises AttributeError as the
real module would. Like TensorRT, it rejects shapes outside the optimisation profile of a context, and the
parser rejects graphs with operators TensorRT's parser does not take. Execution reads inputs from and writes
outputs to the bound addresses, running the ONNX graph with ONNX Runtime on the CPU, so the vvs TensorRT
backend's binding logic runs end to end without a GPU.
"""
from __future__ import annotations

import ctypes
import json

import numpy as np
import onnx
import onnxruntime as ort

from vvs.export.trt_check import tensorrt_problems

__version__ = "11.4.0.106"
calls: list[tuple] = []  # every builder/runtime call, for tests to inspect


class Logger:
    WARNING = 2
    ERROR = 1

    def __init__(self, severity=WARNING):
        self.severity = severity


class MemoryPoolType:
    WORKSPACE = "WORKSPACE"


class BuilderFlag:  # TensorRT 11 keeps flags like these; FP16/INT8/BF16/FP8 and the precision constraints are gone
    TF32 = "TF32"
    REFIT = "REFIT"


class TimingCache:
    def __init__(self, data: bytes):
        self.data = data or b"fake-timing-cache"

    def serialize(self):
        return self.data


class OptimizationProfile:
    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, lo, opt, hi):
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)) or not len(lo) == len(opt) == len(hi):
            raise ValueError(f"bad profile for {name}: {lo} {opt} {hi}")
        self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))


class BuilderConfig:
    def __init__(self):
        self.profiles = []
        self.builder_optimization_level = 3
        self.cache = None

    def set_memory_pool_limit(self, pool, size):
        calls.append(("set_memory_pool_limit", pool, size))

    def set_flag(self, flag):
        calls.append(("set_flag", flag))

    def create_timing_cache(self, data):
        return TimingCache(data)

    def set_timing_cache(self, cache, ignore_mismatch):
        self.cache = cache
        return True

    def get_timing_cache(self):
        return self.cache

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)
        return len(self.profiles) - 1


class Network:
    def __init__(self):
        self.onnx_path = None
        self.inputs = {}


class Builder:
    def __init__(self, logger):
        self.logger = logger

    def create_network(self, flags=0):
        return Network()

    def create_builder_config(self):
        return BuilderConfig()

    def create_optimization_profile(self):
        return OptimizationProfile()

    def build_serialized_network(self, network, config):
        calls.append(("build", network.onnx_path, len(config.profiles)))
        if not config.profiles:
            return None
        for profile in config.profiles:
            for name, rank in network.inputs.items():
                if name not in profile.shapes or len(profile.shapes[name][0]) != rank:
                    return None  # TensorRT refuses profiles that leave a dynamic input unset
        return json.dumps({"onnx": network.onnx_path, "profiles": [p.shapes for p in config.profiles]}).encode()


class OnnxParser:
    def __init__(self, network, logger):
        self.network = network
        self.errors = []

    def parse_from_file(self, path):
        model = onnx.load(path, load_external_data=False)
        self.errors = tensorrt_problems(model)
        self.network.onnx_path = path
        self.network.inputs = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input}
        return not self.errors

    @property
    def num_errors(self):
        return len(self.errors)

    def get_error(self, i):
        return self.errors[i]


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

    def create_execution_context(self):
        return ExecutionContext(self)


class Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data):
        try:
            return Engine(json.loads(bytes(data)))
        except (ValueError, KeyError):
            return None
