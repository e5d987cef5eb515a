//! `--device` values.

use std::fmt;
use std::str::FromStr;

/// Where a run computes, as written on the command line (`--device`).
///
/// Parsing accepts exactly `cpu`, `cuda` (the same as `cuda:0`) and `cuda:N` with `N` a
/// decimal device index. [`Display`](fmt::Display) writes `cpu` or `cuda:N`, which parses back
/// to the same spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// The host CPU (the default).
    #[default]
    Cpu,
    /// The CUDA device with this index (the driver's ordinal, as in `nvidia-smi`, subject to
    /// `CUDA_VISIBLE_DEVICES`).
    Cuda(u32),
}

impl DeviceSpec {
    /// Whether this is the CPU.
    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A `--device` value that is not a device; its message names the value and what is expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseDeviceError {
    value: String,
    bad_index: bool,
}

impl ParseDeviceError {
    /// The value that did not parse.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for ParseDeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bad_index {
            write!(
                f,
                "{:?} is not a device: the index after \"cuda:\" must be a whole number (cuda:0, cuda:1, ...)",
                self.value
            )
        } else {
            write!(
                f,
                "{:?} is not a device: expected cpu, cuda or cuda:N (N the GPU index, e.g. cuda:0)",
                self.value
            )
        }
    }
}

impl std::error::Error for ParseDeviceError {}

impl FromStr for DeviceSpec {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |bad_index| ParseDeviceError {
            value: s.to_string(),
            bad_index,
        };
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                // Digits only: u32::from_str would also take a leading '+'.
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    n.parse().map(DeviceSpec::Cuda).map_err(|_| err(true))
                }
                Some(_) => Err(err(true)),
                None => Err(err(false)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:0".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        assert_eq!("cuda:007".parse(), Ok(DeviceSpec::Cuda(7)));
        assert_eq!(DeviceSpec::default(), DeviceSpec::Cpu);
        assert!(DeviceSpec::Cpu.is_cpu() && !DeviceSpec::Cuda(0).is_cpu());
    }

    #[test]
    fn display_round_trips() {
        for s in [
            DeviceSpec::Cpu,
            DeviceSpec::Cuda(0),
            DeviceSpec::Cuda(12),
            DeviceSpec::Cuda(u32::MAX),
        ] {
            assert_eq!(s.to_string().parse::<DeviceSpec>(), Ok(s), "{s}");
        }
        assert_eq!(DeviceSpec::Cpu.to_string(), "cpu");
        assert_eq!(DeviceSpec::Cuda(1).to_string(), "cuda:1");
        // `cuda` is written in its explicit form.
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap().to_string(), "cuda:0");
    }

    #[test]
    fn errors_name_the_value_and_what_is_expected() {
        for bad in ["gpu", "", "CPU", "Cuda", " cpu", "cuda0", "cuda;1", "cpu:0"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert_eq!(e.value(), bad);
            let m = e.to_string();
            assert!(m.contains(&format!("{bad:?}")), "{m}");
            assert!(m.contains("expected cpu, cuda or cuda:N"), "{m}");
        }
        for bad in [
            "cuda:",
            "cuda:x",
            "cuda:-1",
            "cuda:+1",
            "cuda:1.0",
            "cuda:99999999999",
        ] {
            let m = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(m.contains(&format!("{bad:?}")), "{m}");
            assert!(m.contains("must be a whole number"), "{m}");
        }
    }
}
