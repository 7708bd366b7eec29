"""GPU readings from NVML (package nvidia-ml-py), every catalog field NVML can give.

Per GPU and cycle: one ``nvmlDeviceGetFieldValues`` call for the counters (ECC, NVLink
and PCIe traffic and errors, row remapping; energy and PCIe replays every 10 s), a handful of direct calls (utilization,
memory, power, temperature, clocks, clock event reasons, processes) and, on Hopper and
newer, one GPM sample: GPM metrics come from two samples (this cycle's and the last one),
so the first cycle has none. Without GPM, PCIe and NVLink rates come from NVML's byte
counters and the profiling ratios (SM activity, tensor, DRAM...) are "not available".

MIG: the physical GPU keeps its row (power, temperature, clocks, errors) and every MIG
instance gets its own row (memory, GPM activity through ``nvmlGpmMigSampleGet``, processes).
XID errors arrive on an NVML event set watched by a background thread.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.protocol import Event, GpuInfo

from .base import GpuReading, SourceAttribution
from .nvml_lib import NA, GpuLost, Nvml, NvmlUnavailable

__all__ = ["NvmlSource", "NvmlUnavailable"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# GPM metric id -> (catalog field, scale to catalog unit). Ids from nvml.h (nvmlGpmMetricId_t).
GPM_METRICS: dict[int, tuple[str, float]] = {
    1: ("gr_engine_active", 0.01),   # GRAPHICS_UTIL %
    2: ("sm_active", 0.01),          # SM_UTIL %
    3: ("sm_occupancy", 0.01),       # SM_OCCUPANCY %
    5: ("tensor_active", 0.01),      # ANY_TENSOR_UTIL %
    10: ("dram_active", 0.01),       # DRAM_BW_UTIL %
    11: ("fp64_active", 0.01),
    12: ("fp32_active", 0.01),
    13: ("fp16_active", 0.01),
    20: ("pcie_tx_bytes_s", MIB),    # PCIE_TX_PER_SEC MiB/s
    21: ("pcie_rx_bytes_s", MIB),
    60: ("nvlink_rx_bytes_s", MIB),  # NVLINK_TOTAL_RX_PER_SEC MiB/s
    61: ("nvlink_tx_bytes_s", MIB),
}
GPM_MIN_GAP_S = 0.1  # NVML wants GPM samples at least 100 ms apart

# nvmlDeviceGetFieldValues ids (nvml.h NVML_FI_DEV_*) -> (field, kind, scale).
# kind "gauge": value as is; "rate": a counter turned into per-second with the previous read.
FIELD_VALUES: dict[int, tuple[str, str, float]] = {
    3: ("ecc_sbe_volatile", "gauge", 1.0),
    4: ("ecc_dbe_volatile", "gauge", 1.0),
    38: ("nvlink_error_count", "gauge", 1.0),   # NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    83: ("energy_j", "gauge", 0.001),           # TOTAL_ENERGY_CONSUMPTION mJ
    94: ("pcie_replay_count", "gauge", 1.0),
    145: ("row_remap_failure", "gauge", 1.0),   # REMAPPED_FAILURE
    138: ("nvlink_tx_bytes_s", "rate", 1024.0),  # NVLINK_THROUGHPUT_DATA_TX KiB counter
    139: ("nvlink_rx_bytes_s", "rate", 1024.0),
    197: ("pcie_tx_bytes_s", "rate", 1.0),       # PCIE_COUNT_TX_BYTES
    198: ("pcie_rx_bytes_s", "rate", 1.0),
}
# Read at most every SLOW_EVERY_S, not every cycle. On an H200 (driver 580) the energy counter
# took 2.7-3.0 ms of a 4 ms field batch, in the batch or by its own call (docs/real-gpu.md);
# both are lifetime counters, so a reading every 10 s loses nothing (a job's energy is the
# difference of two readings) and cuts the agent's NVML cost per GPU by more than half.
SLOW_FIELD_IDS = frozenset({83, 94})  # TOTAL_ENERGY_CONSUMPTION, PCIE_REPLAY_COUNTER
SLOW_EVERY_S = 10.0
SLOW_FIELDS = frozenset(FIELD_VALUES[i][0] for i in SLOW_FIELD_IDS)  # energy_j, pcie_replay_count
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_RATIO_FIELDS = frozenset(f for f, s in GPM_METRICS.values() if s == 0.01)

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
NVML_DEVICE_MIG_ENABLE = 1
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)


_NVLINK_FIELDS = ("nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_error_count")


def _drop_nvlink(v: dict[str, float]) -> None:
    for name in _NVLINK_FIELDS:
        v.pop(name, None)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(eq=False)
class _Device:
    info: GpuInfo
    handle: Any
    parent: Any = None  # physical GPU handle, for a MIG instance
    gi_id: int | None = None
    gpm: bool = False
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, spare]
    gpm_prev_t: float | None = None
    counters: dict[str, tuple[float, float]] = field(default_factory=dict)  # field -> (t, counter)
    lost: bool = False
    xid: bool = False  # registered for XID events
    memory_v2: bool = True  # until the driver refuses nvmlDeviceGetMemoryInfo_v2 (before R510)
    nvlink: bool = True  # False when no NVLink answers: its rates are then not read as 0 B/s
    slow_read_t: float | None = None  # when SLOW_FIELD_IDS were last asked for

    @property
    def is_mig(self) -> bool:
        return self.parent is not None


class NvmlSource:
    name = "nvml"

    def __init__(self, module: Any = None, *, gpm: bool = True, xid_events: bool = True,
                 event_poll_ms: int = 500, reprobe_s: float = 60.0) -> None:
        self.nvml = Nvml(module)
        self.reprobe_s = reprobe_s  # how often to look for a lost GPU coming back (after a reset)
        self._last_probe = time.monotonic()
        self.use_gpm = gpm
        self.use_xid = xid_events
        self.event_poll_ms = event_poll_ms
        self._devs: list[_Device] | None = None
        self._by_handle: dict[int, _Device] = {}
        self._events: list[Event] = []
        self._events_lock = threading.Lock()
        self._xid_last: dict[str, int] = {}
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()
        self._event_set: Any = None
        self._pci: dict[str, str] = {}

    @property
    def errors(self) -> int:
        return self.nvml.errors

    def gpu_instance_ids(self) -> dict[str, int]:
        """MIG instance uuid -> GPU instance id (Slurm names MIG mapping files <index>.<id>)."""
        return {d.info.uuid: d.gi_id for d in self._devices() if d.is_mig and d.gi_id is not None}

    def pci_bus_ids(self) -> dict[str, str]:
        """GPU uuid -> sysfs PCI address, for mapping InfiniBand HCAs to GPUs."""
        self._devices()
        return dict(self._pci)

    # --- discovery -----------------------------------------------------------------------

    def devices(self) -> list[GpuInfo]:
        return [d.info for d in self._devices() if not d.lost]

    def _devices(self) -> list[_Device]:
        if self._devs is None:
            self._devs = self._enumerate()
            if self.use_xid:
                self._start_xid_watch()
        return self._devs

    def _enumerate(self) -> list[_Device]:
        n = self.nvml
        count = n.call("nvmlDeviceGetCount")
        if count is NA:
            raise NvmlUnavailable("nvmlDeviceGetCount failed")
        out: list[_Device] = []
        for i in range(int(count)):
            try:
                h = n.call("nvmlDeviceGetHandleByIndex", i)
                if h is NA:
                    continue
                uuid = _text(n.call("nvmlDeviceGetUUID", h))
                model = n.call("nvmlDeviceGetName", h)
                mem = n.call("nvmlDeviceGetMemoryInfo", h)
                gpm = self.use_gpm and self._gpm_supported(h)
                pci = n.call("nvmlDeviceGetPciInfo", h)
                if pci is not NA:
                    # NVML says 00000000:17:00.0, sysfs says 0000:17:00.0
                    self._pci[uuid] = _text(pci.busId)[-12:].lower()
                dev = _Device(GpuInfo(index=i, uuid=uuid, model="" if model is NA else _text(model),
                                      memory_total_bytes=None if mem is NA else float(mem.total)), h, gpm=gpm,
                              nvlink=self._has_nvlink(h))
                out.append(dev)
                out.extend(self._mig_instances(dev))
            except GpuLost as e:
                log.error("GPU %d does not answer (%s): left out until it comes back", i, e)
                self._event("fell_off_bus", None, f"GPU index {i} lost at discovery: {e}")
        for d in out:
            if d.gpm:
                d.gpm_samples = [n.call("nvmlGpmSampleAlloc"), n.call("nvmlGpmSampleAlloc")]
                if NA in d.gpm_samples:
                    d.gpm = False
        self._by_handle = {_handle_key(d.handle): d for d in out if not d.is_mig}
        log.info("NVML: %d GPUs, %d MIG instances, GPM on %d",
                 sum(not d.is_mig for d in out), sum(d.is_mig for d in out), sum(d.gpm for d in out))
        return out

    def _gpm_supported(self, h: Any) -> bool:
        sup = self.nvml.call("nvmlGpmQueryDeviceSupport", h)
        return sup is not NA and bool(getattr(sup, "isSupportedDevice", 0))

    def _mig_instances(self, parent: _Device) -> list[_Device]:
        n = self.nvml
        mode = n.call("nvmlDeviceGetMigMode", parent.handle)
        if mode is NA or int(mode[0]) != NVML_DEVICE_MIG_ENABLE:
            return []
        slots = n.call("nvmlDeviceGetMaxMigDeviceCount", parent.handle)
        out = []
        for j in range(0 if slots is NA else int(slots)):
            mh = n.call("nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, j)
            if mh is NA:  # empty slot
                continue
            uuid = _text(n.call("nvmlDeviceGetUUID", mh))
            name = n.call("nvmlDeviceGetName", mh)
            m = _MIG_PROFILE.search("" if name is NA else _text(name))
            gi = n.call("nvmlDeviceGetGpuInstanceId", mh)
            mem = n.call("nvmlDeviceGetMemoryInfo", mh)
            out.append(_Device(
                GpuInfo(index=parent.info.index, uuid=uuid, model=parent.info.model,
                        mig_profile=m.group(1) if m else None, parent_uuid=parent.info.uuid,
                        memory_total_bytes=None if mem is NA else float(mem.total)),
                mh, parent=parent.handle, gi_id=None if gi is NA else int(gi), gpm=parent.gpm,
                nvlink=parent.nvlink))
        return out

    def _has_nvlink(self, h: Any) -> bool:
        """Whether the GPU has NVLink at all. A PCIe GPU without bridges (seen: an H200 passed
        through to a VM, driver 580) answers NOT_SUPPORTED for every link's state, yet GPM
        reports its NVLink rates as 0 MiB/s: that is "no NVLink", not "NVLink idle"."""
        n = self.nvml
        if getattr(n.lib, "nvmlDeviceGetNvLinkState", None) is None:
            return True  # this nvidia-ml-py cannot tell: trust the counters, as before
        for link in range(int(n.const("NVML_NVLINK_MAX_LINKS", 18))):
            errors = n.errors
            if n.call("nvmlDeviceGetNvLinkState", h, link) is not NA or n.errors > errors:
                return True  # a link answered, or a failure that says nothing about links
        return False

    # --- sampling ------------------------------------------------------------------------

    def read(self, now: float) -> list[GpuReading]:
        out: list[GpuReading] = []
        lost_parents: set[int] = set()
        devs = self._devices()
        if time.monotonic() - self._last_probe >= self.reprobe_s and any(d.lost for d in devs):
            self._reprobe()
        for d in self._devs or []:
            if d.lost:
                continue
            if d.is_mig and _handle_key(d.parent) in lost_parents:
                d.lost = True
                continue
            try:
                values, pids = self._read_mig(d, now) if d.is_mig else self._read_gpu(d, now)
            except GpuLost as e:
                d.lost = True
                if not d.is_mig:
                    lost_parents.add(_handle_key(d.handle))
                log.error("GPU %d (%s) fell off the bus (%s): sampling the others", d.info.index, d.info.uuid, e)
                self._event("fell_off_bus", d.info.uuid, str(e), code=e.code)
                continue
            out.append(GpuReading(uuid=d.info.uuid, values=values, pids=pids))
        return out

    def _reprobe(self) -> None:
        """A GPU reset (nvidia-smi -r) brings a lost GPU back under the same index and UUID
        with a new handle: take it (and its MIG instances) back into the readings."""
        self._last_probe = time.monotonic()
        n = self.nvml
        for d in [d for d in self._devs or [] if d.lost and not d.is_mig]:
            try:
                h = n.call("nvmlDeviceGetHandleByIndex", d.info.index)
                if h is NA or _text(n.call("nvmlDeviceGetUUID", h)) != d.info.uuid:
                    continue
                back = _Device(d.info, h, gpm=d.gpm, gpm_samples=d.gpm_samples, nvlink=d.nvlink)
                migs = self._mig_instances(back)
            except GpuLost:
                continue
            for m in migs:
                m.gpm_samples = [n.call("nvmlGpmSampleAlloc"), n.call("nvmlGpmSampleAlloc")] if m.gpm else []
            # Replace the lost device and its old MIG rows, in place, keeping the order.
            devs = self._devs or []
            i = devs.index(d)
            old_migs = [x for x in devs[i + 1 :] if x.info.parent_uuid == d.info.uuid]
            for x in old_migs:
                for smp in x.gpm_samples:
                    n.call("nvmlGpmSampleFree", smp)
            self._devs = [*devs[:i], back, *migs, *(x for x in devs[i + 1 :] if x not in old_migs)]
            self._by_handle[_handle_key(h)] = back
            if self._event_set is not None and n.call("nvmlDeviceRegisterEvents", h, XID_EVENT,
                                                      self._event_set) is not NA:
                back.xid = True
            log.warning("GPU %d (%s) answers again: sampling it", d.info.index, d.info.uuid)
            self._event("other", d.info.uuid, "GPU back on the bus (reset)")

    def _read_gpu(self, d: _Device, now: float) -> tuple[dict[str, float], tuple[int, ...]]:
        n, h = self.nvml, d.handle
        v: dict[str, float] = {}
        self._field_values(d, now, v)
        util = n.call("nvmlDeviceGetUtilizationRates", h)
        if util is not NA:
            v["gpu_util"] = util.gpu / 100.0
            v["mem_copy_util"] = util.memory / 100.0
        self._memory(d, v)
        p = n.call("nvmlDeviceGetPowerUsage", h)
        if p is not NA:
            v["power_w"] = p / 1000.0
        if "energy_j" not in v and d.slow_read_t == now:  # asked this cycle, but not in the batch
            e = n.call("nvmlDeviceGetTotalEnergyConsumption", h)
            if e is not NA:
                v["energy_j"] = e / 1000.0
        t = n.call("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)
        if t is not NA:
            v["temp_c"] = float(t)
        c = n.call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM)
        if c is not NA:
            v["sm_clock_mhz"] = float(c)
        c = n.call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_MEM)
        if c is not NA:
            v["mem_clock_mhz"] = float(c)
        r = n.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if r is NA:
            r = n.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if r is not NA:
            v["clock_event_reasons"] = float(int(r) & 0xFFFFFFFF)
        if d.gpm:
            self._gpm(d, now, v)
        # Last resort for PCIe: a 20 ms blocking sample, only when neither GPM nor counters gave it.
        if "pcie_tx_bytes_s" not in v and "pcie_tx_bytes_s" not in d.counters:
            for fld, ctr in (("pcie_tx_bytes_s", NVML_PCIE_UTIL_TX_BYTES),
                             ("pcie_rx_bytes_s", NVML_PCIE_UTIL_RX_BYTES)):
                kb = n.call("nvmlDeviceGetPcieThroughput", h, ctr)
                if kb is not NA:
                    v[fld] = kb * 1024.0
        if d.xid:
            v["xid_last"] = float(self._xid_last.get(d.info.uuid, 0))
        if not d.nvlink:
            _drop_nvlink(v)
        return v, self._pids(h)

    def _read_mig(self, d: _Device, now: float) -> tuple[dict[str, float], tuple[int, ...]]:
        v: dict[str, float] = {}
        self._memory(d, v)
        if d.gpm and d.gi_id is not None:
            self._gpm(d, now, v)
        if not d.nvlink:
            _drop_nvlink(v)
        return v, self._pids(d.handle)

    def _memory(self, d: _Device, v: dict[str, float]) -> None:
        """Framebuffer used as nvidia-smi and DCGM count it: without the driver's reservation.
        The v1 call folds the reservation into "used" (616 MiB on an idle H200, driver 580:
        docs/real-gpu.md), which would read as memory held by a job on every idle GPU."""
        n = self.nvml
        version = n.const("nvmlMemory_v2")
        if d.memory_v2 and version is not None:
            errors = n.errors
            mem = n.call("nvmlDeviceGetMemoryInfo", d.handle, version)
            if mem is not NA:
                v["fb_used_bytes"] = float(mem.used)
                v["fb_total_bytes"] = float(mem.total)
                return
            if n.errors > errors:
                return  # a failed read, not an old driver: this cycle has no memory reading
            d.memory_v2 = False  # an older driver: v1 from now on, reservation included
        mem = n.call("nvmlDeviceGetMemoryInfo", d.handle)
        if mem is not NA:
            v["fb_used_bytes"] = float(mem.used)
            v["fb_total_bytes"] = float(mem.total)

    def _pids(self, h: Any) -> tuple[int, ...]:
        procs = self.nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
        return () if procs is NA else tuple(int(p.pid) for p in procs)

    def _field_values(self, d: _Device, now: float, v: dict[str, float]) -> None:
        ids = list(FIELD_VALUES)
        if d.slow_read_t is None or not 0 <= now - d.slow_read_t < SLOW_EVERY_S:
            d.slow_read_t = now
        else:
            ids = [i for i in ids if i not in SLOW_FIELD_IDS]
        res = self.nvml.call("nvmlDeviceGetFieldValues", d.handle, ids)
        if res is NA:
            return
        for fv in res:
            spec = FIELD_VALUES.get(int(fv.fieldId))
            if spec is None or int(fv.nvmlReturn) != 0:
                continue
            name, kind, scale = spec
            raw = float(getattr(fv.value, _VALUE_ATTR.get(int(fv.valueType), "ullVal")))
            if kind == "gauge":
                v[name] = raw * scale
                continue
            ts = fv.timestamp / 1e6 if getattr(fv, "timestamp", 0) else now
            prev = d.counters.get(name)
            d.counters[name] = (ts, raw)
            if prev is not None and ts > prev[0] and raw >= prev[1]:  # a reset or wrap gives no rate
                v[name] = (raw - prev[1]) * scale / (ts - prev[0])

    def _gpm(self, d: _Device, now: float, v: dict[str, float]) -> None:
        """Two-sample GPM: take a sample into the spare buffer, compute metrics against the
        previous one, then swap. The first cycle only primes."""
        n = self.nvml
        t = time.monotonic()
        if d.gpm_prev_t is not None and t - d.gpm_prev_t < GPM_MIN_GAP_S:
            return
        prev, spare = d.gpm_samples
        got = (n.call("nvmlGpmMigSampleGet", d.parent, d.gi_id, spare) if d.is_mig
               else n.call("nvmlGpmSampleGet", d.handle, spare))
        if got is NA:
            return
        primed = d.gpm_prev_t is not None
        d.gpm_samples = [spare, prev]
        d.gpm_prev_t = t
        if not primed:
            return
        mg = n.lib.c_nvmlGpmMetricsGet_t()
        mg.version = n.const("NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(GPM_METRICS)
        mg.sample1 = prev
        mg.sample2 = spare
        for i, mid in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = mid
        if n.call("nvmlGpmMetricsGet", mg) is NA:
            return
        for i, (_mid, (name, scale)) in enumerate(GPM_METRICS.items()):
            m = mg.metrics[i]
            if int(m.nvmlReturn) != 0:
                continue
            val = float(m.value) * scale
            if name in _RATIO_FIELDS:
                val = min(1.0, max(0.0, val))
            v[name] = max(0.0, val)

    # --- events --------------------------------------------------------------------------

    def _event(self, kind: Any, uuid: str | None, message: str, code: int | None = None) -> None:
        with self._events_lock:
            self._events.append(Event(ts=time.time(), kind=kind, gpu_uuid=uuid, code=code, message=message))

    def drain_events(self) -> list[Event]:
        with self._events_lock:
            ev, self._events = self._events, []
        return ev

    def _start_xid_watch(self) -> None:
        n = self.nvml
        es = n.call("nvmlEventSetCreate")
        if es is NA:
            return
        registered = 0
        for d in self._devs or []:
            if d.is_mig:
                continue
            if n.call("nvmlDeviceRegisterEvents", d.handle, XID_EVENT, es) is not NA:
                d.xid = True
                registered += 1
        if not registered:
            n.call("nvmlEventSetFree", es)
            return
        self._event_set = es
        self._xid_thread = threading.Thread(target=self._xid_loop, name="gpufleet-nvml-xid", daemon=True)
        self._xid_thread.start()

    def _xid_loop(self) -> None:
        lib = self.nvml.lib
        while not self._xid_stop.is_set():
            try:
                data = self.nvml.wait_event(self._event_set, self.event_poll_ms)
            except lib.NVMLError as e:
                log.warning("XID event wait failed (%s); retrying in 5 s", e)
                self._xid_stop.wait(5)
                continue
            if data is None:
                continue
            dev = self._by_handle.get(_handle_key(data.device))
            uuid = dev.info.uuid if dev else None
            gi = getattr(data, "gpuInstanceId", None)
            if dev is not None and gi not in (None, 0xFFFFFFFF):
                mig = next((m for m in self._devs or [] if m.is_mig and m.gi_id == gi
                            and m.info.parent_uuid == dev.info.uuid), None)
                uuid = mig.info.uuid if mig else uuid
            xid = int(data.eventData)
            if dev is not None:
                self._xid_last[dev.info.uuid] = xid
            log.warning("XID %d on GPU %s", xid, uuid)
            self._event("xid", uuid, f"NVML XID {xid}", code=xid)

    # --- the rest of the interface -------------------------------------------------------

    def attribution(self, now: float) -> SourceAttribution:
        return SourceAttribution()  # NVML knows processes, not jobs: attributors place them

    def close(self) -> None:
        self._xid_stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(self.event_poll_ms / 1000 + 2)
        if self._devs is not None and self.nvml._initialised:
            for d in self._devs:
                for s in d.gpm_samples:
                    self.nvml.call("nvmlGpmSampleFree", s)
                d.gpm_samples = []
            if self._event_set is not None:
                self.nvml.call("nvmlEventSetFree", self._event_set)
        self.nvml.shutdown()


def _handle_key(h: Any) -> int:
    """A hashable identity for an NVML handle (ctypes pointers compare by address)."""
    try:
        import ctypes

        return ctypes.cast(h, ctypes.c_void_p).value or id(h)
    except (TypeError, ctypes.ArgumentError):
        return id(h)
