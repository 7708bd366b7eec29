"""gpufleet.collector"""
