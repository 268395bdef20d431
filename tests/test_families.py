"""The model families behind one registry: every family is one package found through the registry, the shared code
names no family, the import graph has no cycle, each family's options are its own, and the manifest schema is
composed from the families' parts."""
import ast
import re
from pathlib import Path

import click
import pytest

from vvs.engines.manifest import MANIFEST_SCHEMA, EngineFolderError, check_manifest
from vvs.families.registry import FAMILIES, family_of

from conftest import run_cli

VVS = Path(__file__).resolve().parent.parent / "vvs"
ENTRY_POINTS = ("export", "load_engines", "pipeline", "instruments", "tensorrt_profiles", "scale", "describe_scale",
                "tune", "write_defaults")


def module_names() -> dict[str, Path]:
    names = {}
    for path in VVS.rglob("*.py"):
        parts = path.relative_to(VVS.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(path: Path, known: dict) -> set[str]:
    """Every vvs module ``path`` imports, at the top or inside a function, with the packages it passes through."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vvs"):
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("vvs")]
        for target in targets:
            parts = target.split(".")
            found |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & known.keys()
    return found


def test_the_import_graph_has_no_cycle():
    """Counting imports inside functions too, and the package ``__init__`` every import passes through."""
    known = module_names()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    state: dict[str, int] = {}

    def visit(name, trail):
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_only_the_registry_leads_from_shared_code_into_a_family():
    """No module outside the families (the shared core, vvs/discrete and the tools) imports a family's package, at
    the top or inside a function: it reaches a family through the registry's records and their dotted entry points
    (``vvs.families.registry``, ``vvs.families.base``)."""
    known = module_names()
    packages = {f"vvs.families.{p.parent.name}" for p in (VVS / "families").glob("*/__init__.py")}
    offenders = [f"{name} imports {target}" for name, path in sorted(known.items())
                 if not name.startswith("vvs.families") for target in sorted(imports(path, known) & packages)]
    assert packages and not offenders, "\n".join(offenders)


def test_every_discrete_target_meets_the_contract():
    """Each discrete-token family's target module and config offer what the shared machinery asks of them."""
    from vvs.discrete.target import DiscreteTarget, TargetConfig
    from vvs.families.janus_pro.model import janus_config
    from vvs.families.llamagen.gpt import gpt_config
    from vvs.families.lumina_mgpt.model import lumina_config

    configs = {"llamagen": gpt_config("GPT-tiny"), "janus-pro": janus_config("Janus-tiny"),
               "lumina-mgpt": lumina_config("Lumina-tiny")}
    assert {name for name, f in FAMILIES.items() if f.target_arch is not None} == set(configs)
    members = [m for m in vars(TargetConfig) if not m.startswith("_")]
    for name, config in configs.items():
        target = FAMILIES[name].entry("target_arch").model(config)
        assert isinstance(target, DiscreteTarget), name
        assert [m for m in members if not hasattr(target.config, m)] == [], name


FAMILY_BRANCH = re.compile(r"""(family|model)\s*[!=]=\s*["']|is_mar\b|MAREngineSet|\bisinstance\([^)]*(MAR|GPT)""")


def test_no_code_outside_the_families_names_a_family():
    """A family's differences live in its package and its registry entry; shared code asks the registry."""
    offenders = []
    for path in VVS.rglob("*.py"):
        if path.is_relative_to(VVS / "families"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if FAMILY_BRANCH.search(code) or re.search(rf"""["']({'|'.join(FAMILIES)})["']""", code):
                offenders.append(f"{path.relative_to(VVS.parent)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_family_is_one_package_and_its_entry_points_resolve():
    for name, family in FAMILIES.items():
        assert (VVS / "families" / name.replace("-", "_") / "family.py").is_file()
        for field in ENTRY_POINTS:
            if getattr(family, field) is not None:
                prefixes = ("vvs.families.", "vvs.discrete.", "vvs.runtime.", "vvs.tune")
                assert getattr(family, field).startswith(prefixes), field
                assert callable(family.entry(field)), (name, field)
        for model in family.model_configs:
            assert isinstance(family.config_class(model), type)
        assert set(family.bench_modes) <= set(family.mode_names)
        for flag in family.decoding_flags:  # each flag sets a field of the family's own options
            assert hasattr(family.options(), flag.field), (name, flag.flag)


def test_the_manifest_schema_is_composed_of_the_families_parts():
    model = MANIFEST_SCHEMA["properties"]["model"]["properties"]["family"]
    assert model["enum"] == list(FAMILIES)
    parts = {rule["if"]["properties"]["model"]["properties"]["family"]["const"]: rule["then"]
             for rule in MANIFEST_SCHEMA["allOf"]}
    assert parts == {name: f.manifest_schema for name, f in FAMILIES.items()}


def test_a_manifest_missing_its_familys_part_is_one_error(tiny_folder):
    import json

    manifest = json.loads((tiny_folder / "manifest.json").read_text())
    assert family_of(manifest).name == "llamagen"
    del manifest["model"]["vq"]  # a drafter is optional (drafter-free folders), the tokenizer is not
    with pytest.raises(EngineFolderError, match=r"model: 'vq' is a required property"):
        check_manifest(manifest, tiny_folder / "manifest.json")
    manifest["model"]["family"] = "gpt-9"
    with pytest.raises(EngineFolderError, match=r"model.family: 'gpt-9' is not one of \['llamagen', 'mar', 'janus-pro', 'lumina-mgpt'\]"):
        check_manifest(manifest, tiny_folder / "manifest.json")


@pytest.mark.parametrize("model, args, message", [
    ("mar", ["--t2i"], "option --t2i: applies to --model llamagen only"),
    ("mar", ["--precision", "fp16"], "option --precision: applies to --model llamagen, janus-pro or lumina-mgpt only"),
    ("mar", ["--max-draft-top-k", "4"], "option --max-draft-top-k: applies to --model llamagen, janus-pro or lumina-mgpt only"),
    ("llamagen", ["--prompt-tokens", "32"], "option --prompt-tokens: applies to --model janus-pro or lumina-mgpt only"),
    ("janus-pro", ["--t2i"], "option --t2i: applies to --model llamagen only"),
    # the folder-based official formats say their size in config.json and hold one set of weights
    ("janus-pro", ["--config", "GPT-B"], "option --config: applies to --model llamagen or mar only"),
    ("lumina-mgpt", ["--ema"], "option --ema: applies to --model llamagen or mar only"),
    ("llamagen", ["--vae", "kl16.ckpt"], "option --vae: applies to --model mar only"),
    ("llamagen", ["--draft-config", "mar_base"], "option --draft-config: applies to --model mar only"),
    ("mar", ["--backend", "tensorrt"], "option --backend tensorrt: MAR folders build for tensorrt-rtx only"),
])
def test_another_familys_export_option_is_a_one_line_error(tmp_path, capsys, monkeypatch, model, args, message):
    from vvs.cli.export import main

    code, _, err = run_cli(main, ["--model", model, "--out", tmp_path / "engines", *args], capsys, monkeypatch)
    assert code == 2 and err.strip().count("\n") == 0, err
    assert err.startswith("vvs-export: error: ") and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_export_help_groups_each_familys_options(capsys, monkeypatch):
    """Each option sits under the heading of the families that take it (the discrete-token families share some)."""
    from vvs.cli.common import family_heading
    from vvs.cli.export import main

    code, out, _ = run_cli(main, ["--help"], capsys, monkeypatch)
    assert code == 0
    sections = re.split(r"\n(?=\S[^\n]*:\n)", out)
    by_heading = {s.splitlines()[0]: s for s in sections}
    owners: dict[str, list[str]] = {}
    for family in FAMILIES.values():
        for option in family.export_options:
            owners.setdefault(option.opts[0], []).append(family.name)
    assert {"LlamaGen options:", "MAR options:", "Janus-Pro and Lumina-mGPT options:"} <= set(by_heading)
    for flag, names in owners.items():
        homes = [h for h, s in by_heading.items() if re.search(rf"^\s+{re.escape(flag)}\b", s, re.M)]
        assert homes == [family_heading(names) + ":"], (flag, homes)


def test_run_help_groups_single_family_decoding_flags(capsys, monkeypatch):
    from vvs.cli.run import main

    code, out, _ = run_cli(main, ["--help"], capsys, monkeypatch)
    assert code == 0
    machinery = "LlamaGen, Janus-Pro and Lumina-mGPT options:"  # one decoding machinery
    llamagen = out.split(machinery)[1].split("MAR options:")[0]
    mar = out.split("MAR options:")[1]
    assert "--tree-size" in llamagen and "--num-iter" not in llamagen
    assert "--accept-rule" in mar and "--tree-size" not in mar
    shared = out.split(machinery)[0]
    assert "--cfg" in shared and "--temperature" in shared  # every family takes them


@pytest.mark.parametrize("command", ["run", "bench"])
def test_help_says_shared_modes_once_and_each_familys_published_defaults(capsys, monkeypatch, command):
    """The discrete families share one mode list (once, not once per family); each family's published sampling
    (Janus-Pro guidance 5, Lumina-mGPT top-k 2000) is shown as its own, not LlamaGen's; every scale size is listed."""
    import importlib

    module = importlib.import_module(f"vvs.cli.{command}")
    code, out, _ = run_cli(module.main, ["--help"], capsys, monkeypatch)
    flat = " ".join(out.split())
    assert code == 0
    assert flat.count("sjd-pac-official walks SJD-PAC's tree") == 1, flat
    assert "LlamaGen, Janus-Pro and Lumina-mGPT folders: ar, sd" in flat
    # LlamaGen's class-conditional script samples with guidance 4 and top-k 2000, its text-to-image one with 7.5 and
    # 1000 (the help showed the latter alone); read from the options, since the help wraps lines at hyphens
    helps = {p.name: p.help for p in getattr(module, f"{command}_cmd").params}
    assert helps["cfg_scale"].endswith("(published: LlamaGen c2i 4.0 / t2i 7.5, MAR 1.0, Janus-Pro 5.0, "
                                       "Lumina-mGPT 3.0).")
    assert helps["top_k"].endswith("(published: LlamaGen c2i 2000 / t2i 1000, Janus-Pro 0, Lumina-mGPT 2000).")
    assert helps["draft_top_k"].endswith("(published: LlamaGen 10, Janus-Pro 10, Lumina-mGPT 10).")  # one value
    if command == "bench":
        for family in FAMILIES.values():
            assert all(size in flat for size in family.scale_sizes), family.name


def test_a_family_command_is_a_click_command():
    from vvs.cli.train import family_commands, train_cmd

    commands = family_commands()
    assert commands and all(isinstance(c, click.Command) for c in commands)
    assert {c.name for c in commands} | {"decoder"} == set(train_cmd.commands)


def test_another_familys_decoding_flag_is_a_one_line_error(tiny_folder, tmp_path, capsys, monkeypatch):
    from vvs.cli.run import main

    code, _, err = run_cli(main, ["--engine", tiny_folder, "--num-iter", "8", "--out", tmp_path / "out"], capsys,
                           monkeypatch)
    assert code == 2 and err.strip() == ("vvs-run: error: option --num-iter: applies to MAR engine folders only; this "
                                         "folder holds a LlamaGen model")
    assert not (tmp_path / "out").exists()
