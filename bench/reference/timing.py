"""Timing helpers shared by the PyTorch reference benchmarks: CUDA-event medians and rounding."""
import torch


def median_ms(fn, repeats, warmup=3):
    """Median and minimum milliseconds of `repeats` calls of fn, each timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    return med, times[0]


def sig(x, digits=5):
    """x rounded to `digits` significant digits."""
    return float(f"{x:.{digits}g}")
