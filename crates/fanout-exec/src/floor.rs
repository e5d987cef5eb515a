//! The physical floor of an epoch: its GEMM flops at this machine's measured GEMM rate
//! (`compute_floor_s`) and its gathered feature bytes at the measured copy bandwidth
//! (`memory_floor_s`). No schedule can finish an epoch faster than the larger of the two.
//!
//! The rates ([`MachineRates`]) are measured once per machine and thread count and kept in
//! `machine-rates.json` under fanout's cache folder (`$FANOUT_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/fanout`, else `~/.cache/fanout`), keyed by the CPU's model name, family,
//! model and stepping and by the GEMM kernels' revision ([`GEMM_KERNELS_REVISION`]); delete
//! the file to measure again. Each process times one small product first and measures again
//! when it runs well above the cached rate (rates measured on a busy machine heal). Without a
//! writable cache folder they are measured once per process.

use fanout_compute::{MachineRates, GEMM_KERNELS_REVISION};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// The rates a CPU run's floors are computed with: [`machine_rates`] on the run's `threads`
/// (all of them, every in-process worker's share included, since the flop counters the floors
/// divide are process-wide), defaulting to every core. `None` where they cannot be measured.
pub(crate) fn run_rates(threads: Option<usize>) -> Option<MachineRates> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    machine_rates(rate_threads(threads, cores))
}

/// The thread count a run's rates are measured on: the run's `threads` (default every core),
/// at most `cores`. More threads than cores compute no faster than the cores do; measuring
/// on thousands of them took minutes that no signal could stop, and stored a rate several
/// times too low, so floors above what the cores can reach.
fn rate_threads(threads: Option<usize>, cores: usize) -> usize {
    threads.unwrap_or(cores).min(cores).max(1)
}

/// The cache file's name.
const CACHE_FILE: &str = "machine-rates.json";

/// What the cache file holds.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct CacheFile {
    /// The CPU the rates were measured on ([`cpu_model`]).
    cpu: String,
    /// The [`GEMM_KERNELS_REVISION`] of the build that measured them (0 in files written
    /// before the field existed).
    #[serde(default)]
    kernels: u32,
    /// Rates by thread count.
    rates: BTreeMap<usize, MachineRates>,
}

/// This machine's rates on `threads` threads: from the cache when it has them for this CPU,
/// else measured on a pool of `threads` threads (about half a second) and stored. Measured at
/// most once per process and thread count, even when several in-process workers ask at once.
pub fn machine_rates(threads: usize) -> Option<MachineRates> {
    static MEASURED: OnceLock<Mutex<BTreeMap<usize, MachineRates>>> = OnceLock::new();
    let threads = threads.max(1);
    let memo = MEASURED.get_or_init(|| Mutex::new(BTreeMap::new()));
    // Held while measuring: a second worker waits instead of measuring on the same cores.
    let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = memo.get(&threads) {
        return Some(*r);
    }
    let rates = cached_or_measured(rates_file().as_deref(), threads)?;
    memo.insert(threads, rates);
    Some(rates)
}

/// The rates on `threads` threads from the cache file at `path` when it holds them for this
/// CPU, else measured and stored there (no per-process memo: [`machine_rates`] adds that).
fn cached_or_measured(path: Option<&std::path::Path>, threads: usize) -> Option<MachineRates> {
    let cpu = cpu_model();
    let mut file: CacheFile = path
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|f: &CacheFile| f.cpu == cpu && f.kernels == GEMM_KERNELS_REVISION)
        .unwrap_or_else(|| CacheFile {
            cpu: cpu.clone(),
            kernels: GEMM_KERNELS_REVISION,
            rates: BTreeMap::new(),
        });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("rates-{i}"))
        .build()
        .ok()?;
    let rates = match file.rates.get(&threads) {
        Some(r)
            if r.gemm_flops_per_s > 0.0
                && r.copy_bytes_per_s > 0.0
                && !pool.install(|| beaten_by_probe(r)) =>
        {
            *r
        }
        _ => {
            let r = pool.install(MachineRates::measure);
            file.rates.insert(threads, r);
            if let Some(p) = path {
                store(p, &file);
            }
            r
        }
    };
    Some(rates)
}

/// A small product (`PROBE_SHAPE`) timed now runs faster than this factor times the cached
/// GEMM rate: the cached rate was measured while the machine was busy or slow (a build, tests
/// run in parallel: such rates came out at a half to a third of the quiet rate and made epochs
/// look faster than their floor), so it is measured again. On quiet machines the probe ran at
/// 0.99-1.03x the cached rate (2-core Sapphire Rapids VM) and 1.01-1.09x (2-core Zen 4 VM), so
/// it stays under this margin; a rate 15% low, which the Zen 4 VM measured in a session's
/// first run and kept under a margin of 1.3, is beaten by it.
const PROBE_MARGIN: f64 = 1.15;

/// The probe's `m x k x n`: a layer-shaped product of about 0.27 GFLOP (a millisecond or two
/// on two cores, timed three times).
const PROBE_SHAPE: (usize, usize, usize) = (2048, 256, 256);

/// True when the probe beats `cached`'s GEMM rate by more than [`PROBE_MARGIN`] on the
/// current pool.
fn beaten_by_probe(cached: &MachineRates) -> bool {
    let (m, k, n) = PROBE_SHAPE;
    fanout_compute::cpu::rates::measure_gemm(m, k, n, 3) > PROBE_MARGIN * cached.gemm_flops_per_s
}

/// Writes the cache atomically; failures are ignored (the rates are then measured again by the
/// next process).
fn store(path: &std::path::Path, file: &CacheFile) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(json) = serde_json::to_vec_pretty(file) else {
        return;
    };
    let _ = fanout_compute::io::write_atomically(path, &json);
}

/// The file the rates are cached in, when a cache folder can be named (it may not exist yet).
pub fn rates_file() -> Option<PathBuf> {
    cache_dir().map(|d| d.join(CACHE_FILE))
}

/// fanout's cache folder, when one can be named.
fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("FANOUT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("fanout")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("fanout")))
}

/// The CPU the rates belong to: its model name with its family, model and stepping (virtual
/// machines often name every generation of a vendor's CPUs alike, e.g. "AMD EPYC", while the
/// three numbers tell them apart), or "unknown".
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| cpu_identity(&s))
        .unwrap_or_else(|_| "unknown".into())
}

/// [`cpu_model`] from the text of `/proc/cpuinfo`: `"NAME (family F model M stepping S)"`
/// from the first processor's fields, the parenthesis left out when none of the three is given.
fn cpu_identity(cpuinfo: &str) -> String {
    let field = |key: &str| {
        cpuinfo
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    let name = field("model name").unwrap_or_else(|| "unknown".into());
    let numbers: Vec<String> = ["cpu family", "model", "stepping"]
        .iter()
        .filter_map(|k| field(k).map(|v| format!("{} {v}", k.trim_start_matches("cpu "))))
        .collect();
    if numbers.is_empty() {
        name
    } else {
        format!("{name} ({})", numbers.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_measured_on_at_most_every_core() {
        assert_eq!(rate_threads(None, 16), 16);
        assert_eq!(rate_threads(Some(4), 16), 4);
        assert_eq!(rate_threads(Some(4096), 2), 2);
        assert_eq!(rate_threads(Some(0), 2), 1);
    }

    #[test]
    fn rates_are_measured_once_and_read_back_from_the_cache() {
        // Through the cache file only: the per-process memo may already hold rates measured
        // by other tests of this binary.
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(CACHE_FILE);
        // The file as written, and a file of this CPU and build holding `rates` alone.
        let read =
            || -> CacheFile { serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap() };
        let store_only = |rates: MachineRates| {
            let mut f = CacheFile {
                cpu: cpu_model(),
                kernels: GEMM_KERNELS_REVISION,
                rates: BTreeMap::new(),
            };
            f.rates.insert(rates.threads, rates);
            store(&path, &f);
        };
        let r = cached_or_measured(Some(&path), 1).unwrap();
        assert!(r.gemm_flops_per_s > 0.0 && r.copy_bytes_per_s > 0.0);
        let f = read();
        assert_eq!(f.cpu, cpu_model());
        assert_eq!(f.rates.get(&1), Some(&r));
        // Rates this CPU's cache holds are used as stored, without measuring, to the last
        // bit (this rate once came back one ulp off, before serde_json's float_roundtrip).
        // A GEMM rate no probe beats (so it is kept), with all its digits significant.
        let fake = MachineRates {
            threads: 3,
            gemm_flops_per_s: 135492381042935.23,
            copy_bytes_per_s: 2.0,
        };
        store_only(fake);
        assert_eq!(cached_or_measured(Some(&path), 3), Some(fake));
        // Rates measured with other kernels (an older build's file, without the field) are
        // measured again, and the file then holds this build's revision.
        let old = serde_json::json!({"cpu": cpu_model(), "rates": {"3": fake}});
        std::fs::write(&path, old.to_string()).unwrap();
        let again = cached_or_measured(Some(&path), 3).unwrap();
        assert_ne!(again, fake);
        assert_eq!(read().kernels, GEMM_KERNELS_REVISION);
        // A rate measured on a busy machine (far below what a small product reaches now) is
        // measured again and replaced.
        store_only(MachineRates {
            threads: 2,
            gemm_flops_per_s: 1e6,
            copy_bytes_per_s: 2.0,
        });
        let again = cached_or_measured(Some(&path), 2).unwrap();
        assert!(again.gemm_flops_per_s > 1e8, "{again:?}");
        assert_eq!(read().rates.get(&2), Some(&again));
    }

    #[test]
    fn cpus_of_one_name_but_other_generations_are_told_apart() {
        let zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n\
                    model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\ncpu family\t: 99\n";
        let zen4 = zen3.replace("model\t\t: 1\n", "model\t\t: 17\n");
        assert_eq!(
            cpu_identity(zen3),
            "AMD EPYC (family 25 model 1 stepping 1)"
        );
        assert_eq!(
            cpu_identity(&zen4),
            "AMD EPYC (family 25 model 17 stepping 1)"
        );
        assert_eq!(cpu_identity("model name : Some CPU\n"), "Some CPU");
        assert_eq!(cpu_identity(""), "unknown");
    }
}
