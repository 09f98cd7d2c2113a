"""``kubetune-curves.png``: loss (raw points and a smoothed line; the held-out validation
loss on the same axis when the run measured one, the base model's at step 0 marked as the
reference; a distillation run's held-out KD term beside it), learning rate, tokens/s and a
DPO run's held-out reward accuracy and margin by step, drawn with matplotlib's Agg backend (no
display in a pod).

matplotlib is imported when a figure is drawn, not with this module: the launcher and the
recipe process import the run report at start-up, and matplotlib would add about a second
of CPU and 30 MB of resident memory to each before the first step, for a picture drawn
at a checkpoint or at the end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from kubetune.workspace.held_out_keys import KD_LOSS, REWARD_ACCURACY, REWARD_MARGIN

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Keys a recipe's eval pass logs under (torchtune names it by recipe and version).
EVAL_KEYS = ("val_loss", "eval_loss", "validation_loss")
SIZE_INCHES = (8.0, 8.0)
DPI = 100


def smoothed(values: Sequence[float], weight: float | None = None) -> list[float]:
    """An exponential moving average with TensorBoard's bias correction, so the line
    starts at the first point. The weight grows with the number of points: a 10-step run
    is barely smoothed, a 1000-step one a lot."""
    if weight is None:
        weight = min(0.9, max(0.0, 1 - 20 / max(len(values), 1)))
    out, avg = [], 0.0
    for i, value in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * value
        out.append(avg / (1 - weight ** i) if weight else value)
    return out


def _eval_points(records: Sequence[dict]) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for record in records:
        key = next((k for k in EVAL_KEYS if k in record), None)
        if key is not None:
            xs.append(record["step"])
            ys.append(float(record[key]))
    return xs, ys


def _plot_validation(ax, xs: list[int], ys: list[float]) -> None:
    """The held-out loss beside the training loss; the base model's (step 0) as a star
    with a dotted line across: every later point is read against it."""
    if not xs:
        return
    ax.plot(xs, ys, "s-", color="tab:red", markersize=4, label="validation")
    if xs[0] == 0:
        ax.axhline(ys[0], color="tab:red", linestyle=":", linewidth=1, alpha=0.6)
        ax.plot([0], [ys[0]], "*", color="tab:red", markersize=12,
                label=f"base model (step 0): {ys[0]:.4f}")


def _plot_kd(ax, eval_records: Sequence[dict]) -> None:
    """A distillation run's held-out KD term beside its held-out cross-entropy."""
    points = [r for r in eval_records if KD_LOSS.key in r]
    if points:
        ax.plot([r["step"] for r in points], [float(r[KD_LOSS.key]) for r in points], "d--",
                color="tab:purple", markersize=4, label="validation KD")


def _plot_preference(ax, eval_records: Sequence[dict]) -> None:
    """A DPO run's held-out reward accuracy (left axis) and margin (right axis)."""
    points = [r for r in eval_records if REWARD_ACCURACY.key in r]
    xs = [r["step"] for r in points]
    ax.set_title("Held-out preference pairs")
    ax.set_ylabel("reward accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.plot(xs, [float(r[REWARD_ACCURACY.key]) for r in points], "s-", color="tab:red",
            markersize=4, label="reward accuracy")
    margin = ax.twinx()
    margin.set_ylabel("reward margin")
    margin.plot(xs, [float(r.get(REWARD_MARGIN.key, float("nan"))) for r in points], "^--",
                color="tab:gray", markersize=4, label="reward margin")
    ax.legend(loc="upper left")
    margin.legend(loc="lower right")


def _figure_class() -> type["Figure"]:
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: a pod has no display
    from matplotlib.figure import Figure

    return Figure


def figure(steps: Sequence[dict], eval_records: Sequence[dict] = ()) -> "Figure":
    """The figure: one panel per curve the run has, sharing the step axis."""
    panels = ["loss"]
    if any("lr" in r for r in steps):
        panels.append("lr")
    if any("tokens_per_second" in r for r in steps):
        panels.append("tokens_per_second")
    if any(REWARD_ACCURACY.key in r for r in eval_records):
        panels.append("preference")
    fig = _figure_class()(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels):
        points = [r for r in steps if panel in r]
        xs = [r["step"] for r in points]
        ys = [float(r[panel]) for r in points]
        ax.grid(True, alpha=0.3)
        if panel == "loss":
            ax.set_title("Loss")
            ax.set_ylabel("loss")
            ax.plot(xs, ys, "o", color="tab:blue", alpha=0.35, markersize=3, label="train")
            ax.plot(xs, smoothed(ys), "-", color="tab:blue", label="train (smoothed)")
            _plot_validation(ax, *_eval_points(eval_records))
            _plot_kd(ax, eval_records)
            ax.legend(loc="upper right")
        elif panel == "preference":
            _plot_preference(ax, eval_records)
        elif panel == "lr":
            ax.set_title("Learning rate")
            ax.set_ylabel("learning rate")
            ax.plot(xs, ys, "-", color="tab:orange")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            ax.set_title("Throughput")
            ax.set_ylabel("tokens/s per device")
            ax.plot(xs, ys, "-", color="tab:green")
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    return fig


def save(path: Path, steps: Sequence[dict], eval_records: Sequence[dict] = ()) -> None:
    figure(steps, eval_records).savefig(path, format="png")
