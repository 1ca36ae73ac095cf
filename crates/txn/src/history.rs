//! Recording histories: see the history crate (being wired).
