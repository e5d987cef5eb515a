//! Opening a device and describing it.

use crate::{DeviceSpec, Error};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An opened device: the CPU, or (with the `cuda` feature) a context on one GPU.
///
/// Made only by [`open`]; holding one keeps the GPU context alive.
#[derive(Debug)]
#[non_exhaustive]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// A CUDA device with a context on it.
    #[cfg(feature = "cuda")]
    Cuda(crate::CudaDevice),
}

impl Device {
    /// The spec this device was opened from (`cpu` or `cuda:N`).
    pub fn spec(&self) -> DeviceSpec {
        match self {
            Device::Cpu => DeviceSpec::Cpu,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => DeviceSpec::Cuda(d.index()),
        }
    }

    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// A summary of the device; for a GPU its free memory is queried now.
    pub fn info(&self) -> DeviceInfo {
        match self {
            Device::Cpu => cpu_info(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.info(),
        }
    }
}

/// Opens the device `spec` names.
///
/// `cpu` always succeeds. `cuda:N` fails with
/// - [`Error::NotBuilt`] in a build without the `cuda` feature (the message gives the rebuild
///   command);
/// - [`Error::NoDriver`] when the CUDA driver library cannot be loaded (no panic);
/// - [`Error::NoSuchDevice`] when `N` is not below the driver's device count;
/// - [`Error::Driver`] when a driver call fails (e.g. `cuInit` on a machine whose driver sees
///   no GPU);
///
/// and otherwise returns a `Device::Cuda` with a context on device `N` made current on the
/// calling thread.
pub fn open(spec: DeviceSpec) -> Result<Device, Error> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Cuda(index) => open_cuda(index),
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(index: u32) -> Result<Device, Error> {
    Err(Error::NotBuilt { index })
}

#[cfg(feature = "cuda")]
fn open_cuda(index: u32) -> Result<Device, Error> {
    crate::CudaDevice::open(index).map(Device::Cuda)
}

/// The kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A CUDA GPU.
    Cuda,
}

/// A summary of a device for logs and the JSON metrics, e.g.
/// `{"device":"cuda:0","kind":"cuda","index":0,"name":"NVIDIA H100 80GB HBM3",
/// "total_memory_bytes":85...,"free_memory_bytes":84...}`.
///
/// `device` is the [`DeviceSpec`] text (parses back to the spec); `index` is `None` for the
/// CPU. For the CPU, `name` is the processor model when the OS tells it (Linux
/// `/proc/cpuinfo`, else `"cpu"`) and the memory figures are the host's (Linux `/proc/meminfo`
/// MemTotal / MemAvailable, else `None`); for a GPU they are the device's, in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The device as `--device` writes it (`cpu`, `cuda:N`).
    pub device: String,
    /// CPU or CUDA.
    pub kind: DeviceKind,
    /// The CUDA device index (`None` for the CPU).
    pub index: Option<u32>,
    /// The device's model name.
    pub name: String,
    /// Total memory in bytes, when known.
    pub total_memory_bytes: Option<u64>,
    /// Free (available) memory in bytes when the summary was taken, when known.
    pub free_memory_bytes: Option<u64>,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(f, "{} ({}", self.device, self.name)?;
        if let Some(t) = self.total_memory_bytes {
            write!(f, ", {:.1} GiB", gib(t))?;
        }
        if let Some(free) = self.free_memory_bytes {
            write!(f, ", {:.1} GiB free", gib(free))?;
        }
        f.write_str(")")
    }
}

fn cpu_info() -> DeviceInfo {
    let read = |p| std::fs::read_to_string(p).unwrap_or_default();
    let (total, free) = meminfo_bytes(&read("/proc/meminfo"));
    DeviceInfo {
        device: DeviceSpec::Cpu.to_string(),
        kind: DeviceKind::Cpu,
        index: None,
        name: cpu_model(&read("/proc/cpuinfo")).unwrap_or_else(|| "cpu".to_string()),
        total_memory_bytes: total,
        free_memory_bytes: free,
    }
}

/// The first `model name` of a `/proc/cpuinfo` text.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name" && !v.trim().is_empty()).then(|| v.trim().to_string())
    })
}

/// MemTotal and MemAvailable of a `/proc/meminfo` text, in bytes.
fn meminfo_bytes(meminfo: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
            kib.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_always_opens() {
        let d = open(DeviceSpec::Cpu).unwrap();
        assert!(d.is_cpu());
        assert_eq!(d.spec(), DeviceSpec::Cpu);
        let info = d.info();
        assert_eq!(info.device, "cpu");
        assert_eq!(info.kind, DeviceKind::Cpu);
        assert_eq!(info.index, None);
        assert!(!info.name.is_empty());
        assert!(info.to_string().starts_with("cpu ("), "{info}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_rebuild() {
        const { assert!(!crate::CUDA_BUILT) };
        for (spec, index) in [("cuda", 0), ("cuda:2", 2)] {
            let e = open(spec.parse().unwrap()).unwrap_err();
            assert_eq!(e, Error::NotBuilt { index });
            let m = e.to_string();
            assert!(m.contains("built without CUDA support"), "{m}");
            assert!(m.contains("cargo build --release --features cuda"), "{m}");
        }
    }

    #[test]
    fn info_serialises_for_the_metrics() {
        let info = DeviceInfo {
            device: "cuda:1".into(),
            kind: DeviceKind::Cuda,
            index: Some(1),
            name: "NVIDIA H100 80GB HBM3".into(),
            total_memory_bytes: Some(80 << 30),
            free_memory_bytes: Some(79 << 30),
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["device"], "cuda:1");
        assert_eq!(v["kind"], "cuda");
        assert_eq!(v["index"], 1);
        assert_eq!(v["total_memory_bytes"], 80u64 << 30);
        assert_eq!(serde_json::from_value::<DeviceInfo>(v).unwrap(), info);
        assert_eq!(
            info.to_string(),
            "cuda:1 (NVIDIA H100 80GB HBM3, 80.0 GiB, 79.0 GiB free)"
        );
        let cpu = serde_json::to_value(open(DeviceSpec::Cpu).unwrap().info()).unwrap();
        assert_eq!(cpu["kind"], "cpu");
        assert!(cpu["index"].is_null());
    }

    #[test]
    fn proc_files_parse() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.0GHz\n\nprocessor\t: 1\nmodel name\t: Some CPU @ 2.0GHz\n";
        assert_eq!(cpu_model(cpuinfo).as_deref(), Some("Some CPU @ 2.0GHz"));
        assert_eq!(cpu_model("processor : 0\n"), None);
        let meminfo = "MemTotal:       16384 kB\nMemFree:   100 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(meminfo_bytes(meminfo), (Some(16 << 20), Some(8 << 20)));
        assert_eq!(meminfo_bytes(""), (None, None));
    }
}
