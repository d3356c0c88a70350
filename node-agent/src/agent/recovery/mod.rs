//! After a restart, before anything launches: the host fence, the startup recovery gate, and the memory rebuilt from the journal.

pub mod fence;
pub mod gate;
pub mod rebuild;
