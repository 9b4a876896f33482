"""Built-in tasks (datasets, rewards and model builders) for demos and tests."""

from rlkit.tasks import (  # noqa: F401
    arithmetic,
    colour_shapes,
    preference,
    small_arithmetic,
    tool_arithmetic,
)
