//! Rendering only: the report document (`result::report`) as human text,
//! JSON or JUnit, and the cluster and collective views of the stages'
//! results; where it goes (stdout or a file, atomically).

pub mod cluster;
pub mod collective;
pub mod human;
mod json;
mod junit;
pub mod output;
pub mod style;

pub use human::{Human, progress_line};
pub use json::json;
pub use junit::junit;
pub use output::{Destination, write_report};
