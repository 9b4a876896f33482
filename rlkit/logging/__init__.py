"""Run outputs: TensorBoard event files, a JSON-lines metrics file, a console bar, plots."""

from rlkit.logging.learning_curve import plot_learning_curves
from rlkit.logging.metrics_logger import MetricsLogger, read_metrics, repair_metrics

__all__ = ["MetricsLogger", "plot_learning_curves", "read_metrics", "repair_metrics"]
