"""gpufleet.analysis"""
