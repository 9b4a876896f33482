"""Run outputs: a JSON-lines metrics file, TensorBoard event files, a console bar,
experiment trackers (wandb, MLflow, SwanLab), plots (a run's dashboard, runs compared)."""

from rlkit.logging.learning_curve import plot_learning_curves
from rlkit.logging.metrics_file import read_metrics, repair_metrics
from rlkit.logging.metrics_logger import LoggerStartWarning, MetricsLogger, default_loggers
from rlkit.logging.run_dashboard import plot_run_dashboard
from rlkit.logging.trackers import LoggerContext, Sink, mlflow_key

__all__ = [
    "LoggerContext",
    "LoggerStartWarning",
    "MetricsLogger",
    "Sink",
    "default_loggers",
    "mlflow_key",
    "plot_learning_curves",
    "plot_run_dashboard",
    "read_metrics",
    "repair_metrics",
]
