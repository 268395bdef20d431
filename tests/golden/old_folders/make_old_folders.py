"""Export two small engine folders with the code before the model families moved into packages (commit ace2a24),
and the tokens that code decodes from them on ONNX Runtime. Their manifests and tokens are kept here; run from a
checkout of that commit: PYTHONPATH=. python tests/golden/old_folders/make_old_folders.py OUT (OUT must exist)."""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, "tests")
from conftest import SMALL, small_bundle  # noqa: E402
from test_mar_runtime import DEFAULTS, small_mar  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.export.exporter import export_folder  # noqa: E402
from vvs.export.mar_exporter import export_mar_folder  # noqa: E402
from vvs.models.latents import VQLatents  # noqa: E402
from vvs.models.vq import VQModel, vq_config  # noqa: E402
from vvs.runtime.mar_pipeline import MARPipeline  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402

out = Path(sys.argv[1])
export_folder(small_bundle(Path("/tmp/drafter-train")), out / "llamagen", decoding_defaults=SMALL, progress=False)
torch.manual_seed(0)
vq = VQModel(vq_config("VQ-tiny", codebook_embed_dim=8, encoder_ch_mult=(1, 2, 2, 2), decoder_ch_mult=(1, 2, 2, 2))).eval()
export_mar_folder(small_mar(0), small_mar(1, encoder_depth=1, decoder_depth=1), VQLatents(vq, 2.0), out / "mar", 32,
                  DEFAULTS, {"classes": ["a", "b", "c", "d"]}, progress=False)
tokens = {}
pipe = Pipeline(load_engines(out / "llamagen", "onnxruntime"))
for mode in ("ar", "sd", "vvs"):
    tokens[f"llamagen/{mode}"] = pipe.generate(torch.tensor([1, 3]), mode=mode, seed=4, decode_images=False).tokens
mar = MARPipeline(load_engines(out / "mar", "onnxruntime"))
for mode in ("ar", "cspd"):
    tokens[f"mar/{mode}"] = mar.generate([0, 2], mode=mode, seed=4, decode_images=False).tokens
save_file({k: v.contiguous() for k, v in tokens.items()}, out / "tokens.safetensors")
