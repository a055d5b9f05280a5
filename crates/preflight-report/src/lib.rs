//! Rendering only: the report document (`result::report`) as human text,
//! JSON, JUnit or Prometheus metrics, and the cluster and collective views
//! of the stages' results; the merged cluster report
//! (`result::merged`) as HTML or Markdown; where it goes (stdout or a
//! file, atomically).

mod chart;
pub mod cluster;
pub mod collective;
pub mod diagnosis;
pub mod format;
mod html;
pub mod human;
pub mod input;
mod json;
mod junit;
pub mod listing;
mod markdown;
mod markup;
pub mod output;
mod prometheus;
pub mod style;
pub mod termination;

pub use html::html;
pub use human::{Human, progress_line};
pub use json::json;
pub use junit::junit;
pub use markdown::markdown;
pub use output::{Destination, write_report};
pub use prometheus::prometheus;
