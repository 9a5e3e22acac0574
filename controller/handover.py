"""The one place where the controller's two threads meet (controller/main.py).

The deciding side (controller/decider.py, on the event loop) and the Consul side
(controller/consul_duties.py, in its own thread) share no object but this one, and hand
each other only immutable snapshots:
- decided views: deciding side -> Consul side, which publishes them as leader;
- operator controls and newly discovered agents: Consul side -> deciding side, which takes
  them at the start of a cycle (so the collector's agent list changes only on the event
  loop, never during a pull);
- the running config after a reload: the shell -> Consul side (the catalog service, the
  static agents, the model's name in the documents).
Each slot is replaced whole under one lock; nothing handed over is ever mutated.

Decided views also wake the Consul side (`wait_for_views`): a decision is written as soon
as it is made, not at the Consul loop's next tick, which runs on the same grid and so
would add a whole interval to every detection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from azprobe.controller.config import ControllerConfig
from azprobe.controller.controls import OperatorControls
from azprobe.controller.publish import WeightsView
from azprobe.controller.window_source import AgentTarget


@dataclass(frozen=True)
class CycleInputs:
    """What the deciding side takes at the start of a cycle."""

    controls: OperatorControls
    targets: tuple[AgentTarget, ...] | None  # a new agent list to apply, or None: keep the current one


def frozen_views(views: Mapping[str, WeightsView]) -> Mapping[str, WeightsView]:
    """A read-only copy: the mapping and each view's zones."""
    return MappingProxyType({name: replace(view, zones=MappingProxyType(dict(view.zones)))
                             for name, view in views.items()})


class Handover:
    def __init__(self, config: ControllerConfig) -> None:
        self._lock = threading.Lock()
        self._views_offered = threading.Condition(self._lock)
        self._unread_views = False
        self._views: Mapping[str, WeightsView] | None = None
        self._controls = OperatorControls()
        self._targets: tuple[AgentTarget, ...] | None = None
        self._config = config
        self._reloaded = False

    # --- deciding side -> Consul side --------------------------------------------------
    def offer_views(self, views: Mapping[str, WeightsView]) -> None:
        snapshot = frozen_views(views)
        with self._lock:
            self._views, self._unread_views = snapshot, True
            self._views_offered.notify_all()

    def views(self) -> Mapping[str, WeightsView] | None:
        """The newest decided views (None before the first cycle with a global view)."""
        with self._lock:
            self._unread_views = False
            return self._views

    def wait_for_views(self, timeout_s: float) -> bool:
        """Block until views are offered that neither `views()` nor this call has seen
        (True, and they count as seen), or until `timeout_s` passes or `wake` is called
        (False)."""
        with self._lock:
            if not self._unread_views:
                self._views_offered.wait(max(0.0, timeout_s))
            offered, self._unread_views = self._unread_views, False
            return offered

    def wake(self) -> None:
        """End a `wait_for_views` early (shutdown)."""
        with self._lock:
            self._views_offered.notify_all()

    # --- Consul side (and reload) -> deciding side ---------------------------------------
    def offer_controls(self, controls: OperatorControls) -> None:
        with self._lock:
            self._controls = controls

    def offer_targets(self, targets: Iterable[AgentTarget]) -> None:
        """A new agent list; the newest offer wins, the deciding side applies it once."""
        snapshot = tuple(targets)
        with self._lock:
            self._targets = snapshot

    def take_inputs(self) -> CycleInputs:
        with self._lock:
            inputs = CycleInputs(self._controls, self._targets)
            self._targets = None
        return inputs

    # --- reload -> Consul side ---------------------------------------------------------
    def offer_config(self, config: ControllerConfig) -> None:
        with self._lock:
            self._config, self._reloaded = config, True

    def config(self) -> tuple[ControllerConfig, bool]:
        """The running config, and whether a reload replaced it since the last call."""
        with self._lock:
            reloaded, self._reloaded = self._reloaded, False
            return self._config, reloaded
