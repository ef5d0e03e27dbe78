"""The loss curve of a run, drawn to a PNG with matplotlib's object API.

No pyplot: drawing changes neither matplotlib's backend nor a notebook's figures.
"""

def plot_losses(rows, path):
    """Train and validation loss of the evaluation `rows` against step, written to `path` (PNG) as it is (a run
    writes it through its FileWriter, whole or not at all)."""
    from matplotlib.figure import Figure

    steps = [row["step"] for row in rows]
    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.subplots()
    axes.plot(steps, [row["train_loss"] for row in rows], marker="o", label="train (mean since last eval)")
    axes.plot(steps, [row["val_loss"] for row in rows], marker="o", label="validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
