//! The postgres plugin.
