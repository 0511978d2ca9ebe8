//! Reports: the check report (`gpudiag check`), its exit status, and the environment it records.

pub mod bundle;
pub mod check;
pub mod environment;
pub mod text;
