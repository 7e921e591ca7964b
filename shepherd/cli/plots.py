"""The curves of a job (training loss, eval metric) and of a sweep's trials, drawn where
people would rather look than read: in the terminal (plotext) or as a PNG (matplotlib, the
``plots`` extra)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shepherd.cli.common import EXIT_INVALID, fail
from shepherd.cli.render import console
from shepherd.curves import CurvePoint
from shepherd.models import JobStatus
from shepherd.sweep import SweepStatus

#: Rows of one terminal plot: enough to read a trend, small enough for two on a screen.
PLOT_HEIGHT = 16
#: Beyond this many columns a plot only gets sparser.
MAX_PLOT_WIDTH = 120
#: One mark per series of a shared plot, so the key reads without colour (a log, a pipe).
_MARKS = "•x+o*#@%&=~^"
PNG_HINT = "--png needs matplotlib: pip install 'shepherd[plots]'"


@dataclass
class Series:
    label: str
    points: list[CurvePoint]


@dataclass
class Panel:
    title: str
    ylabel: str
    series: list[Series]
    #: What is said instead of an empty plot.
    empty: str
    #: Series told apart by a mark each and a key under the plot (a sweep's trials).
    keyed: bool = False

    @property
    def drawn(self) -> list[Series]:
        return [s for s in self.series if s.points]


#: The tracked metric that is the training loss itself (a program's job tracks the step's
#: training loss): the loss panel draws it, so it is never said to be missing after that.
TRAINING_LOSS_METRIC = "train_loss"


def _tracked_points(status: JobStatus) -> list[CurvePoint]:
    """The tracked metric's curve; where the status has none (a job that did not keep one),
    the metric its kept checkpoints carry."""
    if status.eval_curve:
        return status.eval_curve
    return [
        CurvePoint(step=c.step, value=c.metric)
        for c in sorted(status.checkpoints, key=lambda c: c.step)
        if c.metric is not None
    ]


def metric_panel(name: str, points: list[CurvePoint], yet: str) -> Panel:
    """A program's own metric, by the program's step."""
    return Panel(
        f"{name} (the program's, by its step)", name, [Series(name, points)], f"no {name}{yet}"
    )


def job_panels(status: JobStatus, metric_name: str | None = None) -> list[Panel]:
    """The training loss, then the tracked metric at each checkpoint, then the program's own
    metrics the job keeps (``metric_name``: only that one); a curve with no points is said to
    be missing once, by its metric's name."""
    yet = "" if status.phase.is_terminal() else " yet"
    if metric_name is not None:
        return [metric_panel(metric_name, status.metric_curves.get(metric_name, []), yet)]
    kept = [
        metric_panel(name, status.metric_curves[name], yet)
        for name in status.headline_metrics()
        if name in status.metric_curves
    ]
    return _loss_panels(status) + kept


def keep_metric(status: JobStatus, name: str) -> None:
    """Make ``name`` one of the status's curves for ``--metric``: the job's kept curve, else
    read from the program's metrics file where this machine sees the job's log directory
    (as ``shepherd logs`` reads its output); otherwise exit 2 saying what there is."""
    if name in status.metric_curves:
        return
    from shepherd import program_metrics, programs

    records = program_metrics.read_all(
        programs.log_dir(status.workflow_id) / program_metrics.DEFAULT_METRICS_FILE
    )
    points = program_metrics.curve(records, name)
    if points:
        status.metric_curves[name] = [CurvePoint(step=s, value=v) for s, v in points]
        return
    kept = ", ".join(status.metric_curves) or "none"
    known = sorted(set(status.metrics) | set(program_metrics.names(records)))
    fail(
        f"--metric {name}: the job keeps no curve of it (it keeps: {kept})"
        + (f"; the program's metrics are: {', '.join(known[:40])}" if known else "")
        + (", and its metrics file is not readable here" if not records else "")
        + " — a spec keeps a curve with training.metrics",
        EXIT_INVALID,
    )


def _loss_panels(status: JobStatus) -> list[Panel]:
    metric = status.eval_metric
    # "yet" only while the job can still record some.
    yet = "" if status.phase.is_terminal() else " yet"
    tracked = _tracked_points(status)
    if metric == TRAINING_LOSS_METRIC:
        panels = [
            Panel(
                f"training loss ({metric}, each step)",
                metric,
                [Series(metric, status.loss_curve)],
                f"no {metric} recorded{yet}",
            )
        ]
        if tracked:  # else: the panel above has drawn it, or said it is missing
            panels.append(
                Panel(f"{metric} at each checkpoint", metric, [Series(metric, tracked)], "")
            )
        return panels
    return [
        Panel(
            "training loss (mean of each chunk)",
            "loss",
            [Series("loss", status.loss_curve)],
            f"no loss recorded{yet}",
        ),
        Panel(
            f"{metric} (at each evaluated checkpoint)",
            metric,
            [Series(metric, tracked)],
            f"no {metric} recorded{yet}",
        ),
    ]


def sweep_panels(status: SweepStatus) -> list[Panel]:
    """Every trial's metric at its evaluated checkpoints, on one plot."""
    series = [
        Series(
            f"trial {t.index}" + (" (best)" if status.best == t.index else ""),
            [CurvePoint(step=step, value=value) for step, value in sorted(t.reports.items())],
        )
        for t in status.trials
    ]
    return [
        Panel(
            f"{status.metric} per trial ({status.goal})",
            status.metric,
            series,
            f"no {status.metric} reported by any trial yet",
            keyed=True,
        )
    ]


def _step_ticks(points: list[CurvePoint], count: int = 7) -> list[int]:
    """Whole steps for the x axis (steps are counted, never 2.33)."""
    lo, hi = min(p.step for p in points), max(p.step for p in points)
    return sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)})


def terminal_text(panels: list[Panel], *, width: int, color: bool) -> str:
    """The panels as terminal text, one plot under the other; a panel with nothing to draw
    is one line saying so."""
    import plotext

    # The caller gives the width (rich's, which knows COLUMNS and pipes): no second guess.
    plotext.terminal.limit(width=False, height=False)
    out: list[str] = []
    for panel in panels:
        drawn = panel.drawn
        if not drawn:
            out.append(panel.empty)
            continue
        fig = plotext.figure
        fig.clear()
        fig.theme("simple")  # colours the curves only: the terminal keeps its background
        fig.plot_size(min(width, MAX_PLOT_WIDTH), PLOT_HEIGHT)
        for i, series in enumerate(drawn):
            signal = fig.signal(
                [p.step for p in series.points],
                [p.value for p in series.points],
                marker=_MARKS[i % len(_MARKS)] if panel.keyed else None,
            )
            fig.draw(signal.lines())
        fig.title(panel.title)
        fig.label("step", axis=0)
        fig.ruler(axis=0).ticks(_step_ticks([p for s in drawn for p in s.points]))
        out.append(fig.build().string(colorless=not color).rstrip())
        if panel.keyed:
            # The key below the plot: a legend inside it would hide the curves' ends.
            out.append(
                "   ".join(f"{_MARKS[i % len(_MARKS)]} {s.label}" for i, s in enumerate(drawn))
            )
    return "\n".join(out) + "\n"


def png_supported() -> bool:
    """Whether matplotlib (the ``plots`` extra) is installed; asked before connecting, so
    a missing extra costs no round trip."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write_png(panels: list[Panel], path: Path, *, title: str) -> None:
    """The panels, one under the other, as a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure of its own (no pyplot): no GUI backend, no global state.
    fig = Figure(figsize=(9, 3.4 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    for ax, panel in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels, strict=True):
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        if not panel.drawn:
            ax.text(0.5, 0.5, panel.empty, ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for series in panel.drawn:
            # Few points (evaluations) are marked; a long loss curve is a line.
            marker = "o" if len(series.points) <= 50 else None
            ax.plot(
                [p.step for p in series.points],
                [p.value for p in series.points],
                marker=marker,
                markersize=3,
                label=series.label,
            )
        if panel.keyed:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.savefig(path, format="png", dpi=100)


# ------------------------------------------------------------------ what the commands call


def check_options(*, plot: bool, png: Path | None, as_json: bool) -> None:
    """Refuse ``--plot``/``--png`` mistakes before connecting (exit 2)."""
    if plot and as_json:
        fail("--plot draws for people and --json prints data: use one of them", EXIT_INVALID)
    if png is None:
        return
    if not png_supported():
        fail(PNG_HINT, EXIT_INVALID)
    if not png.parent.is_dir():
        fail(f"--png {png}: there is no directory {png.parent}", EXIT_INVALID)


def show(panels: list[Panel], *, plot: bool, png: Path | None, title: str, quiet: bool) -> None:
    """Draw the panels in the terminal (``plot``) and/or write them to ``png``; ``quiet``
    (JSON output) keeps stdout for the data."""
    if plot:
        # Colour only for a terminal: a log or a pipe gets plain text.
        color = console.is_terminal and not console.no_color
        console.file.write(terminal_text(panels, width=console.width, color=color))
        console.file.flush()
    if png is not None:
        try:
            write_png(panels, png, title=title)
        except OSError as exc:
            fail(f"--png {png}: {exc.strerror or exc}", EXIT_INVALID)
        if not quiet:
            console.print(f"wrote {png}", highlight=False, markup=False)
