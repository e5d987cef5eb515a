"""torch.index_select on the GPU with the shapes of the `cuda_kernels` example's gathers, to
compare fanout's row gather with PyTorch's on the same machine (bench/gpu_kernels.sh).

Prints, per shape, the median of 10 timed gathers after 2 warm-ups (ids already on the device)
and the rate in GB/s of rows read + written, as the example does."""
import statistics
import sys
import time

import torch


def median_ms(f):
    for _ in range(2):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    if not torch.cuda.is_available():
        sys.exit("no CUDA device for torch")
    g = torch.Generator(device="cuda").manual_seed(1)
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    for table_rows, cols, rows in [(2_449_029, 100, 1_000_000), (500_000, 256, 100_000)]:
        table = torch.rand(table_rows, cols, device="cuda", generator=g)
        ids = torch.randint(0, table_rows, (rows,), device="cuda", generator=g)
        ms = median_ms(lambda: torch.index_select(table, 0, ids))
        gbs = 2 * rows * cols * 4 / (ms * 1e-3) / 1e9
        print(f"torch.index_select {rows} rows of {table_rows} x {cols}: {ms:.3f} ms {gbs:.1f} GB/s")


if __name__ == "__main__":
    main()
