//! Reports for people: the check report as text, and `gpudiag report`, which judges what the
//! bug-report bundle (written by `gpudiag_export::bundle_writer`) holds.

pub mod bundle;
pub mod text;
