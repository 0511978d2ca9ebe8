#!/usr/bin/env python3
"""Cost of one nvmlDeviceGetFieldValues call on GPU 0 (pynvml): the twelve counters gpudiag reads
on every poll, with and without the five clock-event duration fields, and those five alone.
Usage on a GPU host: python3 benches/nvml_field_cost.py"""
