"""The profiler: what each site can offer over time (power and carbon traces; links later)."""
