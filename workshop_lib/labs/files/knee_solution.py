def my_knee(samples_per_s):
    """The knee of a measured curve ``{batch per device: samples/s}``: the smallest batch
    whose samples/s is within 10% of the best the curve reached."""
    best = max(samples_per_s.values())
    return min(batch for batch, rate in samples_per_s.items() if rate >= 0.9 * best)
