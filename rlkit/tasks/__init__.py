"""Built-in tasks (datasets, rewards and model builders) for demos and tests."""

from rlkit.tasks import arithmetic, colour_shapes, preference, tool_arithmetic  # noqa: F401
