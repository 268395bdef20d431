"""What every vvs command shares: how it runs (one-line errors, exit codes, signals), the option groups defined
once (engine folder, modes, conditions, the families' decoding flags), and turning those options into classes,
prompts and seeds.

Every user error (bad option, bad file, bad folder) is printed as one line ``<prog>: error: ...`` and exits with
code 2; nothing half-written is left behind (writers use a temporary name and rename).
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from vvs.errors import VVSError
from vvs.families.base import Family
from vvs.families.registry import FAMILIES
from vvs.runtime.options import OptionsError


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so that the same clean-up runs."""


_signalled: list[KeyboardInterrupt] = []  # the interrupt this process received, if any


def _interrupt(signum, frame):
    _signalled.append(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt())
    raise _signalled[-1]


def catch_signals() -> None:
    """Deliver Ctrl-C and SIGTERM as :class:`KeyboardInterrupt`. Called again by code that starts a library which
    installs its own handlers (Ray replaces SIGTERM's with one that dumps a stack and exits 15)."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


def run_command(command: click.Command, prog: str) -> None:
    """Run a command: usage errors as one line and exit 2; Ctrl-C exits 130 and SIGTERM 143 after the clean-up
    (finished images kept, the scheduler stopped at a cycle boundary). Libraries may turn the interrupt into an
    error of their own (torch's exporter does, when it lands inside an import): any error after the signal is
    the interrupt."""
    catch_signals()
    try:
        try:
            command.main(prog_name=prog, standalone_mode=False)
        except Exception as err:
            if _signalled and not isinstance(err, (click.exceptions.Exit, click.Abort)):
                raise _signalled[-1] from None
            raise
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        click.echo(f"{prog}: error: {err.format_message()} (see {prog} --help)", err=True)
        sys.exit(2)
    except OptionsError as err:
        click.echo(f"{prog}: error: {flag_message(err)}", err=True)
        sys.exit(2)
    except VVSError as err:
        click.echo(f"{prog}: error: {err}", err=True)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt):
        terminated = bool(_signalled) and isinstance(_signalled[-1], Terminated)  # every signal is recorded
        click.echo(f"{prog}: {'terminated' if terminated else 'interrupted'}", err=True)
        sys.exit(143 if terminated else 130)


# --------------------------------------------------------------------------- help grouped by family


class FamilyCommand(click.Command):
    """A command whose ``--help`` lists each family's own options under a heading of their own."""

    def __init__(self, *args, family_options: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.family_options = family_options or {}  # parameter name -> heading

    def format_options(self, ctx, formatter):
        sections: dict[str, list] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(self.family_options.get(param.name, "Options"), []).append(record)
        for heading, records in sections.items():
            with formatter.section(heading):
                formatter.write_dl(records)


def listing(words: list[str], conjunction: str) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def family_heading(names: list[str]) -> str:
    labels = [FAMILIES[n].label for n in names]
    return f"{listing(labels, 'and')} options" if len(labels) < len(FAMILIES) else "Options"


# --------------------------------------------------------------------------- decoding flags

def decoding_flags() -> dict[str, dict]:
    """Every family's ``vvs-run`` / ``vvs-bench`` flags by flag: its field, type, help and the families that take
    it (a flag two families take, such as ``--cfg``, is one option)."""
    flags: dict[str, dict] = {}
    for family in FAMILIES.values():
        for f in family.decoding_flags:
            entry = flags.setdefault(f.flag, {"field": f.field, "type": f.type, "help": f.help, "families": []})
            entry["families"].append(family.name)
    return flags


def with_decoding_options(fn):
    """The decoding flags, each defaulting to the engine folder's value."""
    for flag, entry in reversed(decoding_flags().items()):
        published = ", ".join(published_value(FAMILIES[n], entry["field"]) for n in entry["families"])
        kind = {"is_flag": True} if entry["type"] is bool else {"type": entry["type"]}
        fn = click.option(flag, entry["field"], default=None, **kind,
                          help=f"{entry['help']} Default: the engine folder's (published: {published}).")(fn)
    return fn


def published_value(family: Family, field: str) -> str:
    """``LlamaGen 10``, or each script's value where the release's scripts differ: ``LlamaGen c2i 4.0 / t2i 7.5``."""
    values = {script: getattr(opts, field) for script, opts in family.published().items()}
    if len(set(values.values())) == 1:
        return f"{family.label} {next(iter(values.values()))}"
    return f"{family.label} " + " / ".join(f"{script} {value}" for script, value in values.items())


def decoding_headings() -> dict[str, str]:
    return {entry["field"]: family_heading(entry["families"]) for entry in decoding_flags().values()}


def family_overrides(decoding: dict, family: Family) -> dict:
    """The decoding flags given, checked against the folder's family: another family's flag is an error that names
    the family it belongs to."""
    given = {k: v for k, v in decoding.items() if v is not None}
    flags = decoding_flags()
    for name in given:
        if family.flag_of(name) is None:
            flag = next(f for f, entry in flags.items() if entry["field"] == name)
            owners = listing([FAMILIES[n].label for n in flags[flag]["families"]], "and")
            raise VVSError(f"option {flag}: applies to {owners} engine folders only; this folder holds a "
                           f"{family.label} model")
    return given


def check_before_loading(manifest: dict, modes: list[str], overrides: dict, backend: str, device: str | None):
    """What vvs-run and vvs-bench check before anything is loaded (or, with --scale, inflated): every mode's options
    (:func:`check_folder_request`), and that this machine runs the folder on ``backend``. Returns the folder's
    defaults."""
    from vvs.engines import check_backend  # here: it imports torch, which --help and usage errors never need
    from vvs.families.registry import family_of

    defaults = family_of(manifest).options.from_dict(manifest["decoding_defaults"])
    check_folder_request(manifest, backend, defaults, modes, overrides)
    check_backend(manifest, backend, device)
    return defaults


def check_folder_request(manifest: dict, backend: str, defaults, modes: list[str], given: dict) -> None:
    """The check every request takes (:func:`~vvs.runtime.options.check_request`), then each mode's options
    against the folder's bounds as its manifest states them (its family's ``check_options``)."""
    from vvs.families.registry import family_of
    from vvs.runtime.options import check_request

    for opts in check_request(defaults, modes, given):
        family_of(manifest).call("check_options", manifest, backend, opts)


def backend_notice(manifest: dict, backend: str) -> None:
    """--backend torch runs the float32 torch weights a --weights folder's graphs were quantised from: a user who
    asked for an int4 model is told on stderr (one line, before the run) that its tokens are not the int4 graphs'.
    Refusing would take the float32 reference away; saying nothing hid it."""
    from vvs.engines.manifest import REWRITTEN, TORCH_WEIGHTS, graph_weights

    formats = list(dict.fromkeys(w for w in (graph_weights(manifest, name) for name in manifest["graphs"])
                                 if w in REWRITTEN))
    if backend == "torch" and formats and TORCH_WEIGHTS["target"] in manifest["files"]:
        click.echo(f"{click.get_current_context().find_root().info_name}: note: --backend torch runs this folder's "
                   f"float32 weights, not its {' and '.join(formats)} graphs (exact modes sample the float32 "
                   f"target); --backend onnxruntime runs the {' and '.join(formats)} model", err=True)


def flag_message(err: OptionsError) -> str:
    """An option error in the words the user typed: the flag, not the internal field."""
    flag = next((f for f, entry in decoding_flags().items() if entry["field"] == err.option), None)
    if flag is None:
        return str(err)
    if err.value is None:  # the option's presence is the problem, not its value
        return f"option {flag}: {err.why}"
    value = err.value if isinstance(err.value, (int, float)) else repr(err.value)
    return f"option {flag} {value}: {err.why}"


# --------------------------------------------------------------------------- shared option groups

MAX_IMAGES = 100_000  # per mode; more is almost certainly a typo


def mode_option(default: str):
    groups: dict[tuple, list[str]] = {}  # families on one machinery share their modes: say them once
    for f in FAMILIES.values():
        groups.setdefault((tuple(f.mode_names), f.mode_help), []).append(f.label)
    modes = "; ".join(f"{listing(labels, 'and')} folders: {', '.join(names)} ({help})"
                      for (names, help), labels in groups.items())
    return click.option("--mode", "modes", multiple=True,
                        help=f"{modes}. Repeat or comma-separate to compare on the same conditions and seeds. "
                             f"Default: {default}.")


def engine_options(fn):
    """--engine, --backend, --device: which folder, and how to run it."""
    fn = click.option("--device", default=None, help="cpu, cuda or cuda:N (default: what the backend finds).")(fn)
    backends = list(dict.fromkeys(b for f in FAMILIES.values() for b in f.run_backends))
    fn = click.option("--backend", type=click.Choice(["auto", *backends]),
                      default="auto", show_default=True,
                      help="auto: TensorRT plans when built and installed, else ONNX Runtime.")(fn)
    return click.option("--engine", "engine_dir", type=click.Path(), default="engines", show_default=True,
                        help="Engine folder.")(fn)


class_option = click.option("--class", "classes", multiple=True,
                            help="Class id or name; repeat or comma-separate. Default: every class in turn.")
num_images_option = click.option("--num-images", type=click.IntRange(1, MAX_IMAGES), default=None,
                                 help="Images per mode (default: one per --class or prompt, or 4; vvs-bench: 16).")


def prompt_options(fn):
    """--prompt, --prompts: what text-to-image folders draw."""
    fn = click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
                      help="Text-to-image: a UTF-8 file of prompts, one a line (e.g. MS-COCO captions).")(fn)
    return click.option("--prompt", "prompts", multiple=True,
                        help="Text-to-image: a prompt; repeat for more (cleaned and encoded as LlamaGen does).")(fn)


# --------------------------------------------------------------------------- from options to conditions and seeds

def split_values(values: tuple[str, ...]) -> list[str]:
    """Repeatable options that also take comma-separated lists: ``--mode ar,sd --mode vvs``."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def resolve_modes(values: tuple[str, ...], default: list[str], names: dict) -> list[str]:
    modes = split_values(values) or default
    unknown = [m for m in modes if m not in names]
    if unknown:
        raise VVSError(f"option --mode {unknown[0]!r}: unknown; choose from {', '.join(names)}")
    return modes


def resolve_classes(values: tuple[str, ...], names: list[str] | None, num_classes: int, count: int) -> list[int]:
    """Class ids from ``--class`` values (ids or names, repeatable or comma-separated), cycled to ``count``."""
    from vvs.runtime.conditions import class_of  # here: it imports torch, which --help and usage errors never need
    values = split_values(values)
    if not values:
        return [i % num_classes for i in range(count)]
    ids = []
    for v in values:
        found = class_of(v, names or ())
        if found is None:
            known = f"; known names: {', '.join(names)}" if names else ""
            raise VVSError(f"option --class {v!r}: not a class id or name{known}")
        ids.append(found)
    for i in ids:
        if not 0 <= i < num_classes:
            raise VVSError(f"option --class {i}: out of range, the model has {num_classes} classes (0-{num_classes - 1})")
    if count < len(ids):
        raise VVSError(f"option --num-images {count}: fewer than the {len(ids)} classes given; ask for at least "
                       f"{len(ids)} images (the classes repeat in turn) or give fewer classes")
    return [ids[i % len(ids)] for i in range(count)]


def resolve_conditions(engine_dir, manifest: dict, classes, prompts, prompts_file, count: int | None,
                       class_default: int) -> list:
    """Each image's condition, of the kind the folder's family takes: prompts for a text-conditional folder
    (``--class`` refused; the folder must hold its text encoder), else class ids (``--prompt`` refused).
    ``count`` images, or one per prompt, or ``class_default`` classes in turn."""
    from vvs.families.registry import family_of

    family = family_of(manifest)
    if family.text_conditional(manifest):
        if classes:
            raise VVSError("option --class: this folder's model is text-conditional; give --prompt or --prompts")
        if not family.takes_prompts(manifest):
            raise VVSError(f"{engine_dir}: has no text encoder, so prompts cannot be encoded; re-export it with "
                           "vvs-export --t2i --text-encoder, or pass caption embeddings to the Pipeline API")
        return resolve_prompts(prompts, prompts_file, count)
    if prompts or prompts_file:
        raise VVSError(f"option {'--prompt' if prompts else '--prompts'}: this folder's model is class-conditional; "
                       "give --class")
    return resolve_classes(classes, manifest["model"].get("classes"), family.num_classes(manifest),
                           count or class_default)


def resolve_prompts(prompts: tuple[str, ...], prompts_file: str | None, count: int | None) -> list[str]:
    """Prompts from ``--prompt`` (repeatable) then ``--prompts FILE`` (one a line, blank lines skipped), cycled to
    ``count``."""
    texts = list(prompts)
    if prompts_file is not None:
        try:
            lines = Path(prompts_file).read_bytes().decode("utf-8").splitlines()
        except FileNotFoundError:
            raise VVSError(f"option --prompts {prompts_file}: the file does not exist") from None
        except UnicodeDecodeError as err:
            line = Path(prompts_file).read_bytes()[: err.start].count(b"\n") + 1
            raise VVSError(f"option --prompts {prompts_file}: line {line} is not UTF-8; save the file as UTF-8") \
                from None
        except OSError as err:
            raise VVSError(f"option --prompts {prompts_file}: cannot read it ({err.strerror or err})") from None
        from_file = [line for line in lines if line.strip()]
        if not from_file:
            raise VVSError(f"option --prompts {prompts_file}: the file holds no prompts; write one prompt a line "
                           "(blank lines are skipped)")
        texts += from_file
    if not texts:
        raise VVSError("this folder's model is text-conditional: give --prompt TEXT or --prompts FILE")
    for i, text in enumerate(texts):
        if not text.strip():
            raise VVSError(f"option --prompt: prompt {i + 1} of {len(texts)} is empty; describe the image to generate")
    count = count or len(texts)
    if count < len(texts):
        raise VVSError(f"option --num-images {count}: fewer than the {len(texts)} prompts given; ask for at least "
                       f"{len(texts)} images (the prompts repeat in turn) or give fewer prompts")
    return [texts[i % len(texts)] for i in range(count)]


def resolve_seeds(text: str, count: int) -> list[int]:
    """``--seed S`` (image i gets S + i) or ``--seed S1,S2,...`` (one per image)."""
    from vvs.runtime.random import image_seeds

    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise VVSError(f"option --seed {text!r}: give a non-negative integer, or one per image separated by commas")
    try:
        return image_seeds(int(parts[0]) if len(parts) == 1 else [int(p) for p in parts], count)
    except VVSError as err:
        raise VVSError(f"option --{err}") from None
