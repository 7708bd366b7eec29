"""A fake ``pynvml`` module: A100 (with MIG), H100 and H200 devices for tests and benchmarks.

Device attributes follow real ``nvidia-smi -q -x`` captures (../shared/fixtures/nvidia-smi)
and NVIDIA's published specs. Behaviour worth testing is modelled: functions a device does
not support raise NOT_SUPPORTED (A100 has no GPM; MIG instances have no utilization rates),
field values fail per field, counters advance with the fake clock, GPM metrics need two
samples, XID errors arrive on an event set, and a GPU can fall off the bus mid-run
(every call on it then raises GPU_IS_LOST).

Uses the real pynvml's error class and constants (importing pynvml loads no library).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError
GIB = 1024**3
MIB = 1024**2


def _uuid(seed: str, prefix: str = "GPU") -> str:
    h = hashlib.sha1(seed.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class FakeMig:
    gi_id: int
    profile: str
    memory_total: int
    uuid: str = ""
    used: int = 0
    pids: list[int] = field(default_factory=list)
    parent: FakeGpu | None = None
    sm_util: float | None = None  # GPM SM activity of this instance (default: the parent's)


@dataclass
class FakeGpu:
    name: str
    memory_total: int
    gpm: bool
    index: int = 0
    uuid: str = ""
    pci_bus_id: str = ""  # NVML form, 00000000:17:00.0
    max_sm_clock: int = 1980
    mem_clock: int = 2619
    # live state (what a workload would show), in NVML units
    util_gpu: int = 97
    util_mem: int = 41
    used: int = 60 * GIB  # as nvidia-smi and DCGM count it: the driver's reservation apart
    nvlinks: int = 18  # links that answer nvmlDeviceGetNvLinkState (0: a PCIe GPU without bridges)
    reserved: int = 0  # what the driver keeps (nvmlMemory_v2_t.reserved); v1's "used" includes it
    power_mw: int = 612_000
    temp_c: int = 64
    clock_reasons: int = 0
    sm_util: float = 88.0  # GPM percent figures
    sm_occ: float = 44.0
    tensor: float = 52.0
    dram: float = 47.0
    fp64: float = 0.1
    fp32: float = 6.0
    fp16: float = 2.0
    graphics: float = 91.0
    pcie_tx: float = 50 * MIB  # bytes/s
    pcie_rx: float = 200 * MIB
    nvlink_tx: float = 100 * GIB
    nvlink_rx: float = 98 * GIB
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remap_failure: int = 0
    nvlink_crc: int = 0
    pcie_replay: int = 0
    energy_mj_at0: float = 5e9
    pids: list[int] = field(default_factory=list)
    mig: list[FakeMig] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # function names raising NOT_SUPPORTED
    unsupported_fields: set[int] = field(default_factory=set)  # field value ids failing per field
    lost: bool = False

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)


def a100(index: int = 0, *, mig: bool = False, node: str = "fake") -> FakeGpu:
    """NVIDIA A100-SXM4-80GB as captured (driver 535.54.03): 1410 MHz max SM, 1593 MHz memory,
    no GPM; with ``mig`` four 1g.20gb instances (GPU instance ids 3-6, 14 SMs each)."""
    g = FakeGpu("NVIDIA A100-SXM4-80GB", 81920 * MIB, gpm=False, index=index, uuid=_uuid(f"{node}/a100/{index}"),
                max_sm_clock=1410, mem_clock=1593, power_mw=312_000, nvlink_tx=60 * GIB, nvlink_rx=59 * GIB,
                unsupported_fields={197, 198}, nvlinks=12)
    if mig:
        g.mig = [FakeMig(gi, "1g.20gb", 19968 * MIB, uuid=_uuid(f"{node}/a100/{index}/mig{gi}", "MIG"), parent=g)
                 for gi in (3, 4, 5, 6)]
        g.util_gpu = g.util_mem = 0
    return g


def h100(index: int = 0, *, mig: bool = False, node: str = "fake") -> FakeGpu:
    """NVIDIA H100 80GB HBM3 (SXM5): 1980 MHz max SM, 2619 MHz HBM3, GPM supported; with
    ``mig`` two 3g.40gb instances (GPU instance ids 1 and 2), GPM per instance."""
    g = FakeGpu("NVIDIA H100 80GB HBM3", 81559 * MIB, gpm=True, index=index, uuid=_uuid(f"{node}/h100/{index}"))
    if mig:
        g.mig = [FakeMig(gi, "3g.40gb", 40448 * MIB, uuid=_uuid(f"{node}/h100/{index}/mig{gi}", "MIG"), parent=g)
                 for gi in (1, 2)]
    return g


def h200(index: int = 0, *, node: str = "fake") -> FakeGpu:
    """NVIDIA H200 (SXM, 141 GB HBM3e): 1980 MHz max SM, 3201 MHz memory, GPM supported."""
    return FakeGpu("NVIDIA H200", 143771 * MIB, gpm=True, index=index, uuid=_uuid(f"{node}/h200/{index}"),
                   mem_clock=3201, power_mw=655_000, reserved=616 * MIB)  # reserved: as seen, driver 580


class _Struct(SimpleNamespace):
    pass


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class GpmMetricsGet:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t (plain attributes instead of ctypes)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(64)]


@dataclass
class _GpmSample:
    t: float = -1.0
    snapshot: dict[int, float] = field(default_factory=dict)


class FakeNvml:
    """Module-like object with pynvml's names. ``clock`` drives counters and GPM."""

    NVMLError = NVMLError
    NVML_GPM_METRICS_GET_VERSION = 1
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    c_nvmlGpmMetricsGet_t = GpmMetricsGet

    def __init__(self, gpus: list[FakeGpu], clock: Callable[[], float] = time.monotonic,
                 init_error: int | None = None) -> None:
        self.gpus = gpus
        if len({g.uuid for g in gpus}) < len(gpus):  # presets built without distinct indexes
            for i, g in enumerate(gpus):
                g.uuid = _uuid(f"{g.name}/{i}/{id(self)}")
        for i, g in enumerate(gpus):
            g.index = i
        self.clock = clock
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.initialised = False
        self._events: queue.Queue[_Struct] = queue.Queue()
        self._registered: set[int] = set()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Constants the agent may ask for; functions we do not model are "not in this version".
        if name.startswith("NVML_") or name.startswith("nvmlEventType"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # --- helpers --------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def _gpu(self, h: Any, fn: str) -> FakeGpu:
        self._count(fn)
        if not self.initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        g = h.parent if isinstance(h, FakeMig) else h
        assert isinstance(g, FakeGpu)
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def fall_off_bus(self, index: int) -> None:
        self.gpus[index].lost = True

    def inject_xid(self, index: int, xid: int, gi_id: int = 0xFFFFFFFF) -> None:
        g = self.gpus[index]
        if id(g) in self._registered:
            self._events.put(_Struct(device=g, eventType=0x8, eventData=xid, gpuInstanceId=gi_id,
                                     computeInstanceId=0xFFFFFFFF))

    # --- init -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._count("nvmlDeviceGetHandleByIndex")
        g = self.gpus[i]
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        self._gpu(h, "nvmlDeviceGetUUID")
        return h.uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        g = self._gpu(h, "nvmlDeviceGetName")
        return f"{g.name} MIG {h.profile}" if isinstance(h, FakeMig) else g.name

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> _Struct:
        # pynvml calls nvmlDeviceGetMemoryInfo_v2 when given a version: a driver before R510
        # lacks it (list that name in FakeGpu.unsupported to model one).
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        total = h.memory_total
        reserved = 0 if isinstance(h, FakeMig) else g.reserved
        if version:
            return _Struct(version=version, total=total, reserved=reserved, used=h.used,
                           free=total - h.used - reserved)
        return _Struct(total=total, used=h.used + reserved, free=total - h.used - reserved)

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link >= g.nvlinks:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1  # NVML_FEATURE_ENABLED: the link is up

    def nvmlDeviceGetPciInfo(self, h: Any) -> _Struct:
        g = self._gpu(h, "nvmlDeviceGetPciInfo")
        return _Struct(busId=g.pci_bus_id or f"00000000:{0x17 + g.index:02X}:00.0")

    # --- MIG ------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if g.name.startswith("NVIDIA H") and not g.mig:
            return [0, 0]
        return [1, 1] if g.mig_enabled else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._gpu(h, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, j: int) -> FakeMig:
        g = self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if j >= len(g.mig):
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return g.mig[j]

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        self._gpu(h, "nvmlDeviceGetGpuInstanceId")
        if not isinstance(h, FakeMig):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return h.gi_id

    # --- readings -------------------------------------------------------------------------

    def _not_on_mig(self, h: Any) -> None:
        if isinstance(h, FakeMig):
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> _Struct:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        self._not_on_mig(h)
        if g.mig_enabled:  # real NVML: utilization is not supported in MIG mode
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _Struct(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetPowerUsage")
        self._not_on_mig(h)
        return g.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption")
        return int(g.energy_mj_at0 + g.power_mw * self.clock())

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTemperature")
        self._not_on_mig(h)
        return g.temp_c

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        self._not_on_mig(h)
        return g.max_sm_clock if kind == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return g.clock_reasons

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return int((g.pcie_tx if counter == 0 else g.pcie_rx) / 1024)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[_Struct]:
        self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [_Struct(pid=p, usedGpuMemory=GIB) for p in h.pids]

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[_Struct]:
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        self._not_on_mig(h)
        t = self.clock()
        counters = {
            3: g.ecc_sbe, 4: g.ecc_dbe, 38: g.nvlink_crc, 83: int(g.energy_mj_at0 + g.power_mw * t),
            94: g.pcie_replay, 145: g.remap_failure,
            138: int(g.nvlink_tx * t / 1024), 139: int(g.nvlink_rx * t / 1024),
            197: int(g.pcie_tx * t), 198: int(g.pcie_rx * t),
        }
        out = []
        for fid in ids:
            ok = fid in counters and fid not in g.unsupported_fields
            out.append(_Struct(fieldId=fid, scopeId=0, timestamp=int(t * 1e6), latencyUsec=0, valueType=3,
                               nvmlReturn=0 if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                               value=_Struct(ullVal=counters.get(fid, 0), dVal=0.0)))
        return out

    # --- GPM ------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> _Struct:
        g = self._gpu(h, "nvmlGpmQueryDeviceSupport")
        return _Struct(version=1, isSupportedDevice=int(g.gpm))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._count("nvmlGpmSampleAlloc")
        return _GpmSample()

    def nvmlGpmSampleFree(self, s: _GpmSample) -> None:
        self._count("nvmlGpmSampleFree")

    def _snapshot(self, g: FakeGpu, s: _GpmSample) -> _GpmSample:
        if not g.gpm:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        s.t = self.clock()
        s.snapshot = {1: g.graphics, 2: g.sm_util, 3: g.sm_occ, 5: g.tensor, 10: g.dram, 11: g.fp64, 12: g.fp32,
                      13: g.fp16, 20: g.pcie_tx / MIB, 21: g.pcie_rx / MIB, 60: g.nvlink_rx / MIB,
                      61: g.nvlink_tx / MIB}
        return s

    def nvmlGpmSampleGet(self, h: Any, s: _GpmSample) -> _GpmSample:
        g = self._gpu(h, "nvmlGpmSampleGet")
        return self._snapshot(g, s)

    def nvmlGpmMigSampleGet(self, h: Any, gi_id: int, s: _GpmSample) -> _GpmSample:
        g = self._gpu(h, "nvmlGpmMigSampleGet")
        mig = next((m for m in g.mig if m.gi_id == gi_id), None)
        if mig is None or isinstance(h, FakeMig):  # NVML wants the parent handle and the GI id
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._snapshot(g, s)
        if mig.sm_util is not None:
            s.snapshot[2] = mig.sm_util
        return s

    def nvmlGpmMetricsGet(self, mg: GpmMetricsGet) -> GpmMetricsGet:
        self._count("nvmlGpmMetricsGet")
        s1, s2 = mg.sample1, mg.sample2
        if s1.t < 0 or s2.t <= s1.t:  # both taken, in order: the two-sample method
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in s2.snapshot:
                m.value, m.nvmlReturn = s2.snapshot[m.metricId], 0
            else:
                m.value, m.nvmlReturn = 0.0, pynvml.NVML_ERROR_NOT_SUPPORTED
        return mg

    # --- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._count("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, es: object) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")
        self._registered.add(id(h))

    def nvmlEventSetWait_v2(self, es: object, timeout_ms: int) -> _Struct:
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, es: object) -> None:
        self._count("nvmlEventSetFree")
