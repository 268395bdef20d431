"""What lets a 7B target be exported on 24 GiB: the exporter holds a graph's weights once, and an inflated target
can be stored in half precision with its buffers computed as in float32."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.models.inflation import empty_model

# A stack of 16 float32 matrices (256 MiB) exported as a folder's two target graphs are, each with a side file of
# weights (as every graph over 1 GiB is) that the folder's one weights file then replaces, in a fresh process: its
# peak resident memory over the module it built, in copies of the weights, so the export holds at most 1.5 times
# the weights it writes. Tracing the module itself held one more copy (1.07 measured); now what remains is one
# matrix's conversion at a time (0.07 float32, 0.14 int4), and sharing copies one 16 MiB piece at a time.
EXPORT_PEAK = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    import torch
    from vvs.export import onnx_export
    from vvs.export.shared_weights import share_weights
    from vvs.export.spec import GraphSpec, TensorSpec
    from vvs.memory import peak_resident_bytes

    class Stack(torch.nn.Module):
        def __init__(self, width=2048):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(16))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def export(module, width):  # twice, as a folder's prefill and verify graphs, then their weights stored once
        shape = ("batch", "new", width)
        folder = Path(tempfile.mkdtemp())
        paths = []
        for name in ("prefill", "verify"):
            spec = GraphSpec(name, (TensorSpec("x", "float32", shape),), (TensorSpec("y", "float32", shape),))
            path = folder / f"{name}.onnx"
            paths.append(onnx_export.export_graph(module, spec, path, 2, 0, weights=sys.argv[1] or None)[0])
        share_weights(folder, paths)

    onnx_export.EXTERNAL_DATA_BYTES = 1 << 10
    export(Stack(64).eval(), 64)  # the exporter's own memory, before the measurement
    module = Stack().eval()
    before = peak_resident_bytes()
    export(module, 2048)
    print((peak_resident_bytes() - before) / (16 * 2048 * 2048 * 4))
""")


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["", "int4"])
def test_an_export_holds_its_weights_at_most_once_more(weights):
    out = subprocess.run([sys.executable, "-c", EXPORT_PEAK, weights], capture_output=True, text=True, check=True)
    growth = float(out.stdout.split()[-1])
    assert growth < 0.5, f"the export grew the process by {growth:.2f} copies of the weights"


def test_an_empty_half_precision_model_computes_buffers_as_in_float32():
    config = gpt_config("GPT-B", n_layer=3, vocab_size=64, grid_size=4)
    reference = GPT(config)
    model = empty_model(GPT, config, torch.float16)
    assert all(p.dtype == torch.float16 and not p.is_meta for p in model.parameters())
    assert {n: p.shape for n, p in model.named_parameters()} == {n: p.shape for n, p in reference.named_parameters()}
    want = dict(reference.named_buffers())
    got = dict(model.named_buffers())
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], want[n]) and got[n].dtype == want[n].dtype for n in want), \
        [n for n in want if not torch.equal(got[n], want[n])]
