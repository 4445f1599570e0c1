//! The redis plugin.
