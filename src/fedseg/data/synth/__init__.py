"""Synthetic multi-site federations (``fedseg data synth``); tasks live in ``synth.tasks``."""

from fedseg.data.synth import tasks as _tasks  # noqa: F401  (registers the tasks)
from fedseg.data.synth.base import SYNTH_TASKS, SynthTask, planned_sites, synthesize

__all__ = ["SYNTH_TASKS", "SynthTask", "planned_sites", "synthesize"]
