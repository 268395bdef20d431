"""``vvs-bench``: decoding modes side by side in one process, on the same classes and seeds.

Settings run interleaved (their order rotates every seed, so machine drift hits all of them alike), after one
untimed warm-up each. Per setting: tokens per target forward, forwards and skips per image, accepted lengths,
seconds per image (median and spread over seeds), the speed-up over ``ar`` as a ratio of medians from this
same run, the draft/verify time split, and — for the shipped model — the quality instruments with AR's
seed-to-seed spread beside them.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from vvs.errors import VVSError
from vvs.output import atomic_write, grid_image, save_png
from vvs.runtime.options import MODE_NAMES
from vvs.runtime.pipeline import Pipeline, as_conditions
from vvs.runtime.stats import aggregate

# which sweep keys apply to which modes (one key at a time, the others at their defaults)
SWEEP_KEYS = {
    "skip_interval": ("vvs", "vvs-uniform"),
    "sim_threshold": ("vvs", "vvs-dynamic"),
    "delta": ("lantern", "vvs", "vvs-uniform", "vvs-dynamic"),
    "lantern_k": ("lantern", "vvs", "vvs-uniform", "vvs-dynamic"),
    "tree_size": ("sd", "lantern", "vvs", "vvs-uniform", "vvs-dynamic"),
    "depth": ("sd", "lantern", "vvs", "vvs-uniform", "vvs-dynamic"),
    "draft_top_k": ("sd", "lantern", "vvs", "vvs-uniform", "vvs-dynamic"),
    "window": ("sjd", "sjd-pac", "gsd"),
    "pac_tree_width": ("sjd-pac",),
    "pac_tree_depth": ("sjd-pac",),
    "draft_steps": ("cspd",),
    "num_iter": ("ar", "cspd"),
    "accept_rule": ("cspd",),
}
OPTION_OF = {"delta": "lantern_delta"}


@dataclass
class Setting:
    label: str
    overrides: dict

    @property
    def mode(self) -> str:
        return self.overrides["mode"]


def parse_sweep(items: tuple[str, ...]) -> dict[str, list]:
    sweep = {}
    for item in items:
        key, _, values = item.partition("=")
        if key not in SWEEP_KEYS or not values:
            raise VVSError(f"option --sweep {item!r}: use KEY=V1,V2 with KEY one of {', '.join(SWEEP_KEYS)}")
        cast = {"sim_threshold": float, "delta": float, "accept_rule": str}.get(key, int)
        try:
            sweep[key] = [cast(v) for v in values.split(",")]
        except ValueError:
            raise VVSError(f"option --sweep {item!r}: {values!r} are not {cast.__name__} values") from None
    return sweep


def make_settings(modes: list[str], sweep: dict[str, list], names: dict = MODE_NAMES) -> list[Setting]:
    """``names``: the mode names of the model family (its registry entry's ``mode_names``)."""
    unknown = [m for m in modes if m not in names]
    if unknown:
        raise VVSError(f"option --mode: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    settings = [Setting(m, dict(names[m])) for m in modes]
    for key, values in sweep.items():
        for m in modes:
            if m in SWEEP_KEYS[key]:
                for v in values:
                    settings.append(Setting(f"{m}[{key}={v}]", {**names[m], OPTION_OF.get(key, key): v}))
    if "ar" not in modes:
        settings.insert(0, Setting("ar", dict(names["ar"])))  # speed-ups are measured against it
    return settings


@dataclass
class Runs:
    seconds: list[float] = field(default_factory=list)  # per seed: seconds per image
    stats: list = field(default_factory=list)
    quality: list[dict] = field(default_factory=list)  # per seed
    images: torch.Tensor | None = None


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def run_benchmark(pipe: Pipeline, settings: list[Setting], classes: list, seeds: int, batch_size: int,
                  instruments=None, progress: bool = True, base_seed: int = 0,
                  target_time_scale: float = 1.0) -> tuple[dict, dict[str, torch.Tensor]]:
    """Returns ``(results, first-seed images per setting)``. ``classes``: class ids, or prompts for a
    text-conditional folder. Seed set j gives image i seed ``base_seed + 1000 j + i``. ``target_time_scale``
    multiplies each image's target seconds (a scale folder with fewer layers than its size: the extrapolation to
    the full depth)."""
    for s in settings:  # validate every setting before spending time
        pipe.options_for(**s.overrides)
    labels = as_conditions(classes)
    runs = {s.label: Runs() for s in settings}
    warm = labels[: min(len(labels), batch_size)]
    for s in settings:
        pipe.generate(warm[:1], seed=10_000, decode_images=False, **s.overrides)
    total = seeds * len(settings) * len(labels)
    # ETA per image; closed before an interrupt's message is printed
    with tqdm(total=total, desc="bench", unit="img", disable=not progress, dynamic_ncols=True) as bar:
        for seed in range(seeds):
            order = settings[seed % len(settings):] + settings[: seed % len(settings)]
            for s in order:
                bar.set_postfix_str(f"seed {seed} {s.label}")
                tokens, images, stats = [], [], []
                for i in range(0, len(labels), batch_size):
                    g = pipe.generate(labels[i : i + batch_size], seed=base_seed + seed * 1000 + i, **s.overrides)
                    for st in g.stats:
                        st.verify_seconds *= target_time_scale
                        st.seconds = st.draft_seconds + st.verify_seconds + st.other_seconds
                    tokens.append(g.tokens)
                    images.append(g.images)
                    stats += g.stats
                    bar.update(len(g.stats))
                r = runs[s.label]
                r.seconds.append(sum(st.seconds for st in stats) / len(stats))
                r.stats += stats
                if instruments is not None:
                    r.quality.append(instruments.evaluate(torch.cat(images), torch.cat(tokens), labels))
                if seed == 0:
                    r.images = torch.cat(images)
    return summarize(runs, settings), {label: r.images for label, r in runs.items()}


def summarize(runs: dict[str, Runs], settings: list[Setting]) -> dict:
    ar_median = statistics.median(runs["ar"].seconds)
    modes = {}
    for s in settings:
        r = runs[s.label]
        agg = aggregate(r.stats)
        n = agg["images"]
        entry = {
            "mode": s.mode,
            "options": s.overrides,
            "tokens_per_target_forward": agg["tokens_per_target_forward"],
            "target_forwards_per_image": agg["target_forwards"] / n,
            "skipped_verifications_per_image": agg["skipped_verifications"] / n,
            "mean_accept_length": agg["mean_accept_length"],
            "acceptance_rate": agg["acceptance_rate"],
            "drafter_forwards_per_image": agg["drafter_forwards"] / n,
            "seconds_per_image": spread(r.seconds),
            "speedup_vs_ar": ar_median / statistics.median(r.seconds),
            # each seed set is a run of every mode, back to back: its own AR time is the fairest baseline on a noisy
            # host, and the spread over seed sets says how far one run's ratio can be trusted
            "speedup_vs_ar_per_seed_set": spread([a / b for a, b in zip(runs["ar"].seconds, r.seconds)]),
            "draft_seconds_per_image": agg["draft_seconds"] / n,
            "verify_seconds_per_image": agg["verify_seconds"] / n,
            "other_seconds_per_image": agg["other_seconds"] / n,
        }
        if r.quality:
            for key in r.quality[0]:
                entry[key] = spread([q[key] for q in r.quality])
        modes[s.label] = entry
    return {"modes": modes}


def within_ar_spread(entry: dict, ar: dict) -> bool:
    """Quality no worse than AR's worst seed on every instrument (accuracy higher is better, FID/NLL lower)."""
    if "class_accuracy" not in entry:
        return True
    return (entry["class_accuracy"]["median"] >= ar["class_accuracy"]["min"]
            and entry["domain_fid"]["median"] <= ar["domain_fid"]["max"]
            and ("nll" not in entry or entry["nll"]["median"] <= ar["nll"]["max"]))


def markdown_table(results: dict) -> str:
    modes = results["modes"]
    quality = [k for k in ("class_accuracy", "domain_fid", "nll") if k in modes["ar"]]
    head = ["setting", "TPF", "target fwd/img", "skipped/img", "accept len", "s/img (median [min-max])",
            "speed-up vs ar (per seed set: median [min-max])", "draft/verify/runtime s/img"]
    head += [{"class_accuracy": "class acc", "domain_fid": "domain FID", "nll": "NLL"}[k] for k in quality]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, e in modes.items():
        s = e["seconds_per_image"]
        accepted = (f"{e['mean_accept_length']:.2f}" if e.get("acceptance_rate") is None
                    else f"{e['acceptance_rate']:.1%} of drafts")
        cells = [label, f"{e['tokens_per_target_forward']:.2f}", f"{e['target_forwards_per_image']:.1f}",
                 f"{e['skipped_verifications_per_image']:.1f}", accepted,
                 f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]", speedup_cell(e),
                 f"{e['draft_seconds_per_image']:.3f}/{e['verify_seconds_per_image']:.3f}/"
                 f"{e['other_seconds_per_image']:.3f}"]
        cells += [f"{e[k]['median']:.3f} [{e[k]['min']:.3f}-{e[k]['max']:.3f}]" for k in quality]
        rows.append("| " + " | ".join(cells) + " |")
    note = f"\n{results['scale']}\n" if results.get("scale") else ""
    if "peak_resident_bytes" in results:  # results of earlier versions lack it
        weights = results.get("weight_bytes")
        ratio = f", {results['peak_resident_bytes'] / weights:.2f}x the folder's weights" if weights else ""
        note += (f"\npeak resident memory {results['peak_resident_bytes'] / 2**30:.2f} GiB{ratio} (the whole process: "
                 "sessions, caches and decodes, and the export of a --scale folder made by this run)"
                 + (f"; the folder's weights {weights / 2**30:.3f} GiB\n" if weights else "\n"))
    return "\n".join(rows) + "\n" + note


def speedup_cell(entry: dict) -> str:
    """The ratio of medians, or with several seed sets the median and range of each set's own ratio."""
    runs = entry.get("speedup_vs_ar_per_seed_set")
    if runs is None or runs["min"] == runs["max"]:
        return f"{entry['speedup_vs_ar']:.2f}x"
    return f"{runs['median']:.2f}x [{runs['min']:.2f}-{runs['max']:.2f}]"


def pareto_plot(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = pareto_figure(results)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def pareto_figure(results: dict):
    """Speed-up and TPF against the quality axis (domain FID when measured, else NLL-free: TPF only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = results["modes"]
    ar = modes["ar"]
    quality = "domain_fid" in ar
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "speedup_vs_ar", "wall-clock speed-up vs ar (same run)"),
                              (axes[1], "tokens_per_target_forward", "tokens per target forward")):
        for label, e in modes.items():
            x = e["domain_fid"]["median"] if quality else 0.0
            ax.scatter(x, e[metric], s=40, zorder=3)
            ax.annotate(label, (x, e[metric]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if quality:
            ax.axvspan(ar["domain_fid"]["min"], ar["domain_fid"]["max"], color="grey", alpha=0.2,
                       label="AR seed-to-seed spread")
            ax.set_xlabel("domain FID (lower is better)")
            # below the axes: inside them it covered whichever point fell in its corner
            ax.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1.0, -0.13), frameon=False)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def write_results(results: dict, out: Path, sample_images: dict[str, torch.Tensor]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", lambda tmp: tmp.write_text(json.dumps(results, indent=1) + "\n"))
    atomic_write(out / "table.md", lambda tmp: tmp.write_text(markdown_table(results)))
    pareto_plot(results, out / "pareto.png")
    for label, images in sample_images.items():
        safe = label.replace("[", "_").replace("]", "").replace("=", "-")
        save_png(grid_image(images), out / f"samples_{safe}.png")


def load_instruments(folder: Path, manifest: dict):
    """The shipped model's quality instruments, when the engine folder holds the shipped model (same classes)."""
    from vvs.shipped import SHIPPED_DIR, shipped_info
    from vvs.families.registry import family_of
    from vvs.train.shipped import load_classifier

    try:
        shipped = [c["name"] for c in shipped_info()["classes"]]
    except VVSError:
        return None
    if manifest["model"].get("classes") != shipped:
        return None
    classifier = load_classifier(SHIPPED_DIR / "classifier.safetensors")
    return family_of(manifest).call("instruments", folder, manifest, classifier)
