"""Device specifications the generators draw on: vendor figures (NVIDIA data sheets) and what
NVML reports for the part (name string, framebuffer size in MiB, idle and boost clocks).

The physics in ``signals`` only needs a handful of numbers per part; they are kept here so a
scenario says "an H100 node" and gets consistent power, clocks, memory and link capacities."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class Device:
    model: str  # NVML device name, as nvidia-smi prints it
    memory_total_bytes: float  # what nvmlDeviceGetMemoryInfo().total reports (a little under the marketing size)
    tdp_w: float  # default power limit
    idle_w: float  # power with a context open and nothing running
    max_sm_clock_mhz: float  # boost clock
    idle_sm_clock_mhz: float  # clock the driver drops to when idle (clock reason 0x1)
    mem_clock_mhz: float
    nvlink_bytes_s: float  # per direction, all links; 0 = no NVLink
    pcie_bytes_s: float  # per direction, x16
    ib_bytes_s: float  # per direction, the HCA affine to the GPU (0 = none)
    slowdown_temp_c: float  # where software thermal slowdown starts
    c_per_w: float  # steady-state die temperature rise per watt with healthy cooling
    mig_profile: str | None = None
    parent_model: str | None = None


# H100 SXM5 80GB: 700 W, 1980 MHz boost, HBM3 at 2619 MHz, NVLink 4 at 900 GB/s bidirectional,
# PCIe Gen5 x16 ~64 GB/s, one ConnectX-7 NDR 400 Gb/s (50 GB/s) per GPU in DGX/HGX designs.
H100 = Device("NVIDIA H100 80GB HBM3", 81559 * MIB, 700.0, 72.0, 1980.0, 345.0, 2619.0,
              450e9, 64e9, 50e9, 87.0, 0.062)
# A100 SXM4 80GB: 400 W, 1410 MHz, NVLink 3 at 600 GB/s bidirectional, PCIe Gen4, HDR 200 Gb/s.
A100 = Device("NVIDIA A100-SXM4-80GB", 81920 * MIB, 400.0, 60.0, 1410.0, 210.0, 1593.0,
              300e9, 32e9, 25e9, 85.0, 0.11)
# L40S: 350 W PCIe card, no NVLink, 48 GB GDDR6 (46068 MiB reported), 2520 MHz boost.
L40S = Device("NVIDIA L40S", 46068 * MIB, 350.0, 36.0, 2520.0, 210.0, 9001.0, 0.0, 32e9, 0.0, 88.0, 0.15)
# A10G (AWS g5): 300 W, 24 GB GDDR6 (23028 MiB reported), 1710 MHz.
A10G = Device("NVIDIA A10G", 23028 * MIB, 300.0, 26.0, 1710.0, 210.0, 6251.0, 0.0, 32e9, 0.0, 88.0, 0.16)
# MIG 1g.10gb on an H100 80GB: 1/7 of the SMs, 9.75 GiB of framebuffer (the "9.8 GiB" users see);
# power, clocks and temperature are the parent's and NVML answers NOT_SUPPORTED on the instance.
H100_MIG_1G10 = Device("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 * MIB, 700.0, 72.0, 1980.0, 345.0, 2619.0,
                       0.0, 64e9, 0.0, 87.0, 0.062, mig_profile="1g.10gb", parent_model="NVIDIA H100 80GB HBM3")

DEVICES = {d.model: d for d in (H100, A100, L40S, A10G, H100_MIG_1G10)}
