//! One file per part of the screen. Panels read the `App` and draw; none of them asks whether
//! the data is live or recorded.

pub mod detail;
pub mod devices;
pub mod findings;
pub mod header;
pub mod job;
pub mod overlay;
pub mod probes;
pub mod processes;
pub mod topology;
pub mod verdict;
