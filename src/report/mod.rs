//! Reports for people: the check report as text and the bug-report bundle.

pub mod bundle;
pub mod text;
