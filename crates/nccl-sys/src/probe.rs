//! What a node can do before any collective call: is there a CUDA driver,
//! are there devices, which NCCL would be used.

use std::fmt;

use crate::Error;
use crate::cuda::Cuda;
use crate::nccl::{Nccl, NcclVersion};
use crate::search::{CudaSearch, LoadReport, NcclSearch};

/// The device side, in the words the backend reports.
#[derive(Debug, Clone)]
pub enum CudaStatus {
    /// libcuda.so.1 did not load: no NVIDIA driver on this node.
    NotFound { report: LoadReport },
    /// The driver loaded but cuInit or a query failed (driver/kernel module
    /// mismatch, no permission on /dev/nvidia*).
    Unusable { path: String, error: String },
    /// The driver works and sees no device.
    NoDevices { path: String, driver: (u32, u32) },
    Devices {
        path: String,
        count: usize,
        driver: (u32, u32),
    },
}

impl fmt::Display for CudaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaStatus::NotFound { .. } => f.write_str("no CUDA device (libcuda.so.1 not found)"),
            CudaStatus::Unusable { error, .. } => {
                write!(f, "CUDA driver present but unusable: {error}")
            }
            CudaStatus::NoDevices { .. } => f.write_str("CUDA driver present but 0 devices"),
            CudaStatus::Devices { count, driver, .. } => {
                write!(
                    f,
                    "{count} CUDA device{}, driver {}.{}",
                    plural(*count),
                    driver.0,
                    driver.1
                )
            }
        }
    }
}

/// NCCL as found, or why not.
#[derive(Debug, Clone)]
pub struct NcclFound {
    pub path: String,
    pub version: NcclVersion,
    pub report: LoadReport,
}

/// The answer to "can this node run NCCL?", without calling a collective.
#[derive(Debug, Clone)]
pub struct Probe {
    pub cuda: CudaStatus,
    pub nccl: Result<NcclFound, Error>,
}

impl Probe {
    /// Devices present and NCCL loaded: collectives may be tried.
    pub fn available(&self) -> bool {
        matches!(self.cuda, CudaStatus::Devices { .. }) && self.nccl.is_ok()
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.cuda, &self.nccl) {
            (CudaStatus::Devices { count, driver, .. }, Ok(n)) => write!(
                f,
                "available: {count} device{}, driver {}.{}, NCCL {} at {}",
                plural(*count),
                driver.0,
                driver.1,
                n.version,
                n.path
            ),
            (CudaStatus::Devices { .. }, Err(e)) => write!(f, "{}, but {e}", self.cuda),
            // The device side decides first: with no device, NCCL's presence
            // does not change the verdict.
            (cuda, _) => write!(f, "{cuda}"),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Probes the CUDA driver (cuInit, device count, driver version), then
/// loads NCCL to name its version and path. Calls no NCCL function beyond
/// ncclGetVersion.
pub fn probe(cuda: &CudaSearch, nccl: &NcclSearch) -> Probe {
    let cuda_status = match Cuda::search(cuda) {
        Err(Error::NotFound { report, .. }) => CudaStatus::NotFound { report },
        Err(e) => CudaStatus::Unusable {
            path: String::new(),
            error: e.to_string(),
        },
        Ok(c) => match (c.init(), c.driver_version()) {
            (Ok(0), Ok(driver)) => CudaStatus::NoDevices {
                path: c.path().to_string(),
                driver,
            },
            (Ok(count), Ok(driver)) => CudaStatus::Devices {
                path: c.path().to_string(),
                count,
                driver,
            },
            (Err(e), _) | (_, Err(e)) => CudaStatus::Unusable {
                path: c.path().to_string(),
                error: e.to_string(),
            },
        },
    };
    let nccl = Nccl::search(nccl).map(|n| NcclFound {
        path: n.path().to_string(),
        version: n.version(),
        report: n.report().clone(),
    });
    Probe {
        cuda: cuda_status,
        nccl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_documented_sentences() {
        let p = Probe {
            cuda: CudaStatus::NotFound {
                report: LoadReport::default(),
            },
            nccl: Err(Error::InvalidArgument("x".into())),
        };
        assert_eq!(p.to_string(), "no CUDA device (libcuda.so.1 not found)");
        assert!(!p.available());
        let p = Probe {
            cuda: CudaStatus::NoDevices {
                path: "/l".into(),
                driver: (12, 4),
            },
            nccl: Err(Error::InvalidArgument("x".into())),
        };
        assert_eq!(p.to_string(), "CUDA driver present but 0 devices");
        let p = Probe {
            cuda: CudaStatus::Devices {
                path: "/l".into(),
                count: 8,
                driver: (12, 4),
            },
            nccl: Ok(NcclFound {
                path: "/n/libnccl.so.2".into(),
                version: NcclVersion::from_code(22105),
                report: LoadReport::default(),
            }),
        };
        assert_eq!(
            p.to_string(),
            "available: 8 devices, driver 12.4, NCCL 2.21.5 at /n/libnccl.so.2"
        );
        assert!(p.available());
    }
}
