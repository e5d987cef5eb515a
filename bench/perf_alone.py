#!/usr/bin/env python3
"""Where a multi-threaded `fanout train` leaves cores idle, from a `perf script` dump.

    perf record -F 4000 --call-graph dwarf,8192 -o run.data fanout train ... --threads 2
    perf script -i run.data > run.txt
    python3 bench/perf_alone.py run.txt [WINDOW_MS]

A sample of one busy thread with no sample of any other busy thread within WINDOW_MS (0.4 by
default; keep it above the sampling period) was taken while that thread worked alone. Prints
the threads' sample counts, the share of samples taken alone, and the innermost fanout
functions of those samples (closures and rayon frames skipped), most frequent first.
"""
import bisect
import collections
import re
import sys


def read_samples(path):
    """(thread id, time s, frames innermost first) for every sample of `perf script` output."""
    samples, head, stack = [], None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if head:
                samples.append((head[0], head[1], stack))
            head, stack = None, []
        elif not line.startswith((" ", "\t")):
            fields = line.split()
            times = [f for f in fields if re.match(r"^\d+\.\d+:$", f)]
            head = (fields[1], float(times[0][:-1])) if times and len(fields) > 1 else None
        else:
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                stack.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[1].rsplit(" (", 1)[0]))
    if head:
        samples.append((head[0], head[1], stack))
    return samples


def owner(stack, depth=3):
    """The innermost fanout frames of a stack that are not closures or rayon plumbing."""
    own = [f for f in stack if "fanout" in f and "closure" not in f and "call_once" not in f
           and "call_mut" not in f and "rayon" not in f]
    return " < ".join(f[:60] for f in own[:depth]) or (stack[0][:60] if stack else "?")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    try:
        window = (float(sys.argv[2]) if len(sys.argv) > 2 else 0.4) / 1000
        samples = read_samples(sys.argv[1])
    except (OSError, ValueError) as e:
        sys.exit(f"perf_alone: {e}")
    if not samples:
        sys.exit(f"perf_alone: no samples with call chains in {sys.argv[1]}")
    times = collections.defaultdict(list)
    for tid, t, _ in samples:
        times[tid].append(t)
    for ts in times.values():
        ts.sort()
    # The threads that do the work: those with at least a tenth of the busiest one's samples.
    most = max(len(ts) for ts in times.values())
    busy = [tid for tid, ts in times.items() if len(ts) * 10 >= most]

    def others_busy(tid, t):
        for other in busy:
            if other != tid:
                ts = times[other]
                i = bisect.bisect_left(ts, t - window)
                if i < len(ts) and ts[i] <= t + window:
                    return True
        return False

    alone = collections.Counter()
    for tid, t, stack in samples:
        if tid in busy and not others_busy(tid, t):
            alone[owner(stack)] += 1
    span = max(t for _, t, _ in samples) - min(t for _, t, _ in samples)
    print(f"{len(samples)} samples over {span:.3f} s; busy threads (samples): "
          + ", ".join(f"{tid} ({len(times[tid])})" for tid in busy))
    n = sum(alone.values())
    print(f"taken with no other busy thread within {window * 1000:.2f} ms: {n} "
          f"({100 * n / len(samples):.1f}%)")
    for what, count in alone.most_common(20):
        print(f"{count:6d}  {what}")


if __name__ == "__main__":
    main()
