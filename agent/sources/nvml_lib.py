"""The one choke point for every NVML call the agent makes.

* the library is imported and initialised lazily (never at import time), so the agent
  imports on a machine without a driver;
* an unsupported call (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, ...) returns the
  ``NA`` sentinel and is logged once per function: "not available", never a failed sample;
* a GPU that fell off the bus raises ``GpuLost`` so the caller can drop that one GPU;
* any other failure is counted in ``errors`` (exported as a metric) and returns ``NA``.

Tests pass a fake module with pynvml's names instead of the real ``pynvml``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class _NotAvailable:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NA"

    def __bool__(self) -> bool:
        return False


NA: Any = _NotAvailable()

# NVML return codes (stable ABI values, as in nvml.h); kept here so the fake needs none of them.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
NO_DATA = 21
GPU_NOT_FOUND = 28
UNAVAILABLE = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, NOT_FOUND, NO_DATA, 2})  # 2: invalid arg
LOST = frozenset({GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND})


class NvmlUnavailable(RuntimeError):
    """No NVML here: no library, no driver, or no permission."""


class GpuLost(RuntimeError):
    """The GPU stopped answering (fell off the bus, needs a reset)."""

    def __init__(self, code: int, fn: str) -> None:
        super().__init__(f"{fn}: NVML error {code}")
        self.code = code


class Nvml:
    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False
        self.errors = 0
        self.calls = 0
        self._warned: set[str] = set()

    @property
    def lib(self) -> Any:
        if not self._initialised:
            self.init()
        return self._module

    def init(self) -> None:
        with self._lock:
            if self._initialised:
                return
            if self._module is None:
                try:
                    import pynvml
                except ImportError as e:  # nvidia-ml-py is an agent dependency, but be clear
                    raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({e})") from None
                self._module = pynvml
            try:
                self._module.nvmlInit()
            except self._module.NVMLError as e:
                raise NvmlUnavailable(f"nvmlInit failed: {e}") from None
            except OSError as e:
                raise NvmlUnavailable(f"libnvidia-ml could not be loaded: {e}") from None
            self._initialised = True

    def shutdown(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self._module.nvmlShutdown()
                except Exception as e:  # at exit, only worth a debug line
                    log.debug("nvmlShutdown: %s", e)
                self._initialised = False

    def const(self, name: str, default: Any = None) -> Any:
        return getattr(self.lib, name, default)

    def call(self, fn: str, *args: Any) -> Any:
        """``pynvml.<fn>(*args)``, or NA when unsupported; GpuLost when the GPU is gone."""
        lib = self.lib
        self.calls += 1
        f = getattr(lib, fn, None)
        if f is None:
            self._once(fn, "not in this nvidia-ml-py version")
            return NA
        try:
            return f(*args)
        except lib.NVMLError as e:
            code = getattr(e, "value", None)
            if code in UNAVAILABLE:
                self._once(fn, str(e))
                return NA
            if code in LOST:
                raise GpuLost(int(code), fn) from None
            self.errors += 1
            log.debug("%s failed: %s", fn, e)
            return NA

    def wait_event(self, event_set: Any, timeout_ms: int) -> Any:
        """``nvmlEventSetWait_v2``: the event data, or None on timeout. Other failures raise
        NVMLError (the caller backs off); counted like any failed call."""
        lib = self.lib
        self.calls += 1
        try:
            return lib.nvmlEventSetWait_v2(event_set, timeout_ms)
        except lib.NVMLError as e:
            if getattr(e, "value", None) == TIMEOUT:
                return None
            self.errors += 1
            raise

    def _once(self, fn: str, why: str) -> None:
        if fn not in self._warned:
            self._warned.add(fn)
            log.info("NVML %s not available here (%s): its fields are left out", fn, why)

    def error_code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)
