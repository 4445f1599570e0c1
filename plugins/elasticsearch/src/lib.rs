//! The elasticsearch plugin.
