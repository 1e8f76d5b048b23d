"""``fastar bench world-ceiling``: how often would a perfect world model pass the world bar's no-collapse check?

The check asks the generated views' colour spread and high-frequency energy to stay within 25 % of the true
views', over all frames and over the last quarter. The bar's path loops over a patch of the map a little larger
than a view, so those statistics hang on which landmarks that patch holds, and a model is shown only the first
view. This bench asks what the check gives a model that does everything right: it knows the map's ground exactly
(better than any model can, having seen one view of it), copies the first view exactly, draws every landmark it
has not been shown from the world's own generator, renders them perfectly and remembers them when it comes back.

That model is the *oracle* of a bar map and a draw seed: the bar map's ground and the landmarks touching its
first view, plus the draw map's landmarks that touch neither the first view nor lie closer than the generator's
spacing to a kept one. Its views along the bar's path are judged against the bar map's true views by the bar's
own statistics (``world_eval.spread_ratios``, ``no_collapse``). With the draw seed equal to the bar map's seed the
oracle is the map itself and passes every check.

Figures: per bar seed the share of draws that pass, the chance that at least 5 of the 6 seeds pass when each
seed's model is one draw (the product of the per-seed shares, as independent trials), the 5th, 50th and 95th
percentiles of each ratio, and the bundled world model's ratios (from its card's ``world_eval.json``) beside
them, with whether each mode's four ratios lie inside the perfect draws' 5-95 % band of its seed (a check a
perfect model passes nine times in ten per ratio, and which a collapse still fails). ``world_ceiling.json``
holds them, ``world_ceiling.png`` shows the ratios per seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# The perfect world models themselves live with the bar (``demo/world_bar.py``), whose no-collapse band they give.
from ..demo.world_bar import (  # noqa: F401 - oracle_map: this bench's subject, read from here by its tests
    FIRST_DRAW,
    RATIOS,
    WORLD_FRAMES,
    WORLD_SEEDS,
    flat,
    oracle_map,
    seed_ceiling,
)
from ..demo.world_eval import BAR
from .report import machine, write_json


def at_least(k: int, shares: list[float]) -> float:
    """Chance that at least ``k`` of independent trials pass, trial ``i`` with chance ``shares[i]``."""
    dist = np.zeros(len(shares) + 1)
    dist[0] = 1.0
    for p in shares:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return float(dist[k:].sum())


def _model_ratios(eval_path: Path) -> dict:
    """{(mode, seed): four ratios} from a world card's ``world_eval.json``; empty if the file is not there."""
    if not eval_path.is_file():
        return {}
    out = {}
    for case in json.loads(eval_path.read_text())["cases"]:
        out[(case["mode"], case["seed"])] = flat(case["report"]["spread_ratios"])
    return out


def run_world_ceiling(out_dir, draws: int = 20, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES,
                      model_eval: Path | None = None, log=print) -> dict:
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    out = Path(out_dir)
    if model_eval is None:
        from ..demo.settings import WEIGHTS_DIR

        model_eval = WEIGHTS_DIR / "world_eval.json"
    per_seed = [seed_ceiling(s, range(FIRST_DRAW, FIRST_DRAW + draws), frames) for s in seeds]
    model = _model_ratios(model_eval)
    names = [f"{label} {m}" for label, m in RATIOS]
    for row in per_seed:
        arr = np.array(row["ratios"])
        row["percentiles_5_50_95"] = {n: [round(float(v), 3) for v in np.percentile(arr[:, i], [5, 50, 95])]
                                      for i, n in enumerate(names)}
        row["bundled_model"] = {mode: dict(zip(names, r)) for (mode, s), r in model.items() if s == row["seed"]}
        # A fairer check than the bar's: does the model sit where 90 % of perfect draws do, on all four ratios?
        row["bundled_within_perfect_5_95"] = {
            mode: all(row["percentiles_5_50_95"][n][0] <= v <= row["percentiles_5_50_95"][n][2] for n, v in r.items())
            for mode, r in row["bundled_model"].items()}
        log(f"seed {row['seed']}: a perfect draw passes {row['pass_share']:.2f} of {row['draws']}; the bundled model "
            f"inside the perfect draws' 5-95 % band: {row['bundled_within_perfect_5_95'] or 'no figures'}")
    shares = [r["pass_share"] for r in per_seed]
    k = len(seeds) - 1
    report = {"bench": "world-ceiling", "machine": machine(), "frames": frames, "seeds": list(seeds),
              "draw_seeds": [FIRST_DRAW, FIRST_DRAW + draws - 1], "tolerance": BAR["spread_tolerance"],
              "mean_pass_share": round(float(np.mean(shares)), 4),
              f"chance_at_least_{k}_of_{len(seeds)}": round(at_least(k, shares), 4),
              "per_seed": per_seed}
    log(f"mean share {report['mean_pass_share']:.2f}; chance of at least {k} of {len(seeds)} seeds "
        f"{report[f'chance_at_least_{k}_of_{len(seeds)}']:.3f}")
    write_json(out / "world_ceiling.json", report)
    _plot(out / "world_ceiling.png", per_seed, names)
    return report


def _plot(path: Path, per_seed: list[dict], names: list[str]) -> None:
    from ..demo.report import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), sharey=True)
    tol = BAR["spread_tolerance"]
    for i, (ax, name) in enumerate(zip(axes, names)):
        for x, row in enumerate(per_seed):
            ys = [r[i] for r in row["ratios"]]
            ax.scatter([x + 1] * len(ys), ys, s=9, alpha=0.45, color="tab:gray",
                       label="perfect draws" if x == 0 else None)
            for mode, marker, colour in (("dense-global", "o", "tab:blue"), ("fastar", "s", "tab:orange")):
                got = row["bundled_model"].get(mode)
                if got:
                    ax.scatter([x + 1], [got[name]], marker=marker, s=30, color=colour,
                               label=f"bundled, {mode}" if x == 0 else None)
        ax.axhspan(1 - tol, 1 + tol, color="tab:green", alpha=0.12, label="bar's band")
        ax.set_xticks(range(1, len(per_seed) + 1), [str(r["seed"]) for r in per_seed])
        ax.set_xlabel("bar seed")
        ax.set_title(name, fontsize=9)
    axes[0].set_ylabel("generated / true")
    axes[0].legend(fontsize=7)
    fig.suptitle("World bar's no-collapse ratios: perfect world models (one dot per draw) and the bundled model")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
