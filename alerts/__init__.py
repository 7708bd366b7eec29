"""gpufleet.alerts"""
