//! An opt-in per-kernel profile of the backend's stream (`FANOUT_CUDA_PROFILE=1`): CUDA events
//! around every kernel launch, cuBLAS product, copy and transpose, summed per name and printed
//! to standard error when the backend is dropped. It answers "where does the train stage's
//! time go on the GPU" on machines without Nsight: the summed device time against the span
//! from the first event to the last shows how much of the span the stream was busy, and so
//! whether a run is bound by the device or by the host feeding it. The busy share is an upper
//! bound: on an idle stream a span's start event fires at once, so the span also holds the
//! host's time to launch (and for pageable copies, the driver's copy on the host).
//!
//! Work on the backend's side stream (the zero-copy feature gather, see `mapped.rs`) is timed
//! under names starting with [`SIDE`] and listed with the rest, but not counted as the backend
//! stream's busy time: it runs beside that stream's work.
//!
//! Events cost a few microseconds per call and one event pair per call is kept until the
//! report, so this is for measuring, not for production runs.

use cudarc::driver::{sys, CudaEvent, CudaStream};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The prefix of the names of calls timed on the backend's side stream.
pub(crate) const SIDE: &str = "side: ";

/// The recorded spans of one backend (see the module documentation).
pub(crate) struct Profile {
    spans: Mutex<Vec<Span>>,
}

/// One timed call: its name, its events, and the work it did.
struct Span {
    name: &'static str,
    start: CudaEvent,
    end: CudaEvent,
    work: Work,
}

/// What a call's work is counted in.
#[derive(Clone, Copy)]
pub(crate) enum Work {
    /// Not counted.
    None,
    /// Bytes copied.
    Bytes(f64),
    /// Floating-point operations.
    Flops(f64),
}

impl Profile {
    /// A profile when the environment asks for one (`FANOUT_CUDA_PROFILE` set to anything but
    /// `0` or empty), else `None`.
    pub(crate) fn from_env() -> Option<Profile> {
        match std::env::var("FANOUT_CUDA_PROFILE") {
            Ok(v) if !v.is_empty() && v != "0" => Some(Profile {
                spans: Mutex::new(Vec::new()),
            }),
            _ => None,
        }
    }

    /// Runs `f`, which queues work on `stream`, between two timing events named `name`. A
    /// failure to create or record an event drops the span (the profile is best effort; the
    /// work itself is not affected).
    pub(crate) fn span<R>(
        &self,
        stream: &CudaStream,
        name: &'static str,
        work: Work,
        f: impl FnOnce() -> R,
    ) -> R {
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(timing).ok();
        let out = f();
        if let (Some(start), Ok(end)) = (start, stream.record_event(timing)) {
            self.spans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Span {
                    name,
                    start,
                    end,
                    work,
                });
        }
        out
    }

    /// The report: the busy time against the span of the whole profile, then per name the
    /// calls, the summed device time, its share and the rate of counted work (GB/s,
    /// TFLOP/s). Waits for the recorded work.
    pub(crate) fn report(&self) -> String {
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
            return "CUDA profile: nothing was recorded\n".to_string();
        };
        // Per name: calls, milliseconds, bytes, flops.
        let mut by_name: BTreeMap<&str, (usize, f64, f64, f64)> = BTreeMap::new();
        let mut busy = 0.0f64;
        for s in spans.iter() {
            let ms = s.start.elapsed_ms(&s.end).map_or(0.0, f64::from);
            let e = by_name.entry(s.name).or_default();
            e.0 += 1;
            e.1 += ms;
            match s.work {
                Work::None => {}
                Work::Bytes(b) => e.2 += b,
                Work::Flops(f) => e.3 += f,
            }
            if !s.name.starts_with(SIDE) {
                busy += ms;
            }
        }
        let whole = first.start.elapsed_ms(&last.end).map_or(0.0, f64::from);
        let mut rows: Vec<_> = by_name.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut out = format!(
            "CUDA profile (backend stream): {:.1} ms of device time in {:.1} ms from the first \
             event to the last ({:.0}% busy), {} calls\n{:<26} {:>8} {:>11} {:>7}  rate\n",
            busy,
            whole,
            100.0 * busy / whole.max(1e-9),
            spans.len(),
            "call",
            "calls",
            "total ms",
            "share"
        );
        for (name, (calls, ms, bytes, flops)) in rows {
            let secs = (ms / 1e3).max(1e-12);
            let rate = if bytes > 0.0 {
                format!("  {:.1} GB/s ({:.2} GB)", bytes / secs / 1e9, bytes / 1e9)
            } else if flops > 0.0 {
                format!("  {:.1} TFLOP/s", flops / secs / 1e12)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "{name:<26} {calls:>8} {ms:>11.2} {:>6.1}%{rate}\n",
                100.0 * ms / busy.max(1e-9)
            ));
        }
        out
    }
}
