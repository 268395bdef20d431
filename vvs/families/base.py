"""What a model family is to the rest of vvs: one :class:`Family` record in the registry.

A record is data plus the dotted names of the family's entry points (``"package.module:attribute"``), imported on
first use, as vLLM's model registry does: the registry imports no model code, so every layer may consult it
without an import cycle, and a family's heavy modules load only when one of its folders is used.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import click


@dataclass(frozen=True)
class DecodingFlag:
    """A ``vvs-run`` / ``vvs-bench`` flag that overrides one field of the family's decoding options."""

    flag: str  # "--top-p"
    field: str  # "top_p"
    type: Any  # float, int, bool (a switch) or a click type
    help: str


@dataclass(frozen=True)
class Family:
    name: str  # ``--model NAME`` and the manifest's ``model.family``
    label: str  # how messages name it: "LlamaGen", "MAR"
    summary: str  # one line for ``vvs-export --help``
    options: type  # its decoding options dataclass (``from_dict``, ``updated``, ``to_dict``, ``NAMED_MODES``)
    bench_modes: tuple[str, ...]  # ``vvs-bench``'s default modes
    mode_help: str  # what its modes are, for ``--mode``'s help
    # the manifest: this family's part of the JSON Schema (applied where ``model.family`` is its name), and the
    # config class of each model it records ("module:Class") with the sizes the loaders derive from it
    manifest_schema: dict
    model_configs: dict[str, tuple[str, tuple[str, ...]]]
    # what its conditions are: "class" or "text" for a folder's manifest, and how many classes it has
    condition_kind: Callable[[dict], str]
    num_classes: Callable[[dict], int]
    # the options only its ``vvs-export`` takes, and its ``vvs-run`` / ``vvs-bench`` decoding flags
    export_options: tuple[click.Option, ...]
    decoding_flags: tuple[DecodingFlag, ...]
    # entry points (see the module docstring for the form)
    export: str  # (options: dict, out: Path, force: bool, echo) -> manifest
    load_engines: str  # (folder, manifest, backend, device, threads, cuda_graphs) -> engine set
    pipeline: str  # (engines, max_batch=...) -> generate / options_for / decode / close
    instruments: str  # (folder, manifest, classifier) -> vvs.quality.Instruments
    tensorrt_profiles: str  # (manifest, graph name, max_images) -> [{input: (min, opt, max)}]
    check_options: str  # (manifest, backend, options): the folder's bounds, from its manifest, before it loads
    build_backends: tuple[str, ...] = ("tensorrt", "tensorrt-rtx")  # what ``vvs-export --backend`` may also build
    run_backends: tuple[str, ...] = ("onnxruntime", "openvino", "torch", "tensorrt", "tensorrt-rtx")
    # optional abilities: an entry point, or None
    # a discrete-token family's target architecture (vvs.discrete.arch.TargetArch), which the shared graphs,
    # exporter and engine sets build on; None for a family with its own (MAR)
    target_arch: str | None = None
    check_export: str | None = None  # (its vvs-export options): refuses a combination before anything is loaded
    scale: str | None = None  # vvs-bench --scale: (engine_dir, size) -> the inflated folder
    scale_sizes: tuple[str, ...] = ()
    describe_scale: str | None = None  # (manifest) -> one line, or None for an ordinary folder
    tune: str | None = None  # vvs-bench --tune: (pipe, labels, num_seeds, instruments, log) -> (best, record)
    write_defaults: str | None = None  # (folder, defaults, record): stores what --tune picked
    serve: bool = False  # vvs-serve
    train_commands: tuple[str, ...] = ()  # its ``vvs-train`` subcommands ("module:command")
    # vvs-train decoder, for a family whose shipped record measures the shared VQ tokenizer its pair is trained on:
    # (the retrained tokenizer, held-out crops in [-1, 1]) -> (its shipped json's name, that record measured anew)
    remeasure_tokenizer: str | None = None
    # what a user who asks for something the family lacks should do instead, by ability ("tune", "scale", ...)
    instead: dict[str, str] = field(default_factory=dict)
    # the official release's sampling where it differs from the options class's defaults: the decoding defaults of
    # a folder exported from an official checkpoint, and the published values the commands' help shows
    sampling: dict[str, Any] = field(default_factory=dict)
    # where the release's sampling scripts differ by condition kind ("c2i", "t2i"): each script's own changes
    script_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)

    def published(self) -> dict[str, Any]:
        """The decoding options the family's official release samples with, by the script that samples them (one
        entry, keyed "", where one script samples for every folder)."""
        return {script: self.options().updated(**self.sampling, **own)
                for script, own in (self.script_sampling or {"": {}}).items()}

    @property
    def mode_names(self) -> dict[str, dict]:
        """What ``--mode`` and the HTTP APIs accept -> the options each name stands for."""
        return self.options.NAMED_MODES

    def entry(self, name: str) -> Any:
        """The entry point in field ``name``, imported on first use."""
        module, _, attribute = getattr(self, name).partition(":")
        return getattr(importlib.import_module(module), attribute)

    def call(self, name: str, *args, **kwargs):
        return self.entry(name)(*args, **kwargs)

    def config_class(self, model: str) -> type:
        module, _, attribute = self.model_configs[model][0].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def text_conditional(self, manifest: dict) -> bool:
        return self.condition_kind(manifest) == "text"

    @staticmethod
    def takes_prompts(manifest: dict) -> bool:
        """Whether a folder turns prompt strings into conditions itself: it holds a text encoder, or the target's
        own tokenizer."""
        return "text" in manifest or "prompts" in manifest

    def flag_of(self, field_name: str) -> str | None:
        return next((f.flag for f in self.decoding_flags if f.field == field_name), None)
