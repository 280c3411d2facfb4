"""`atomlite bench`: latency, throughput and serving benchmarks, each printed beside its roofline."""
